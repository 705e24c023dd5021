"""Reading a run file into pandas DataFrames (docs/hdf5-schema.md).

`open(path)` returns a `Run`. The file is opened read-only in SWMR mode, so a run that is still
being written, or whose writer died, is read as it is; `Run.refresh()` picks up rows flushed since.
Nothing is ever written to the file.

Tables (DataFrames, one row per record, fields as in the schema):
  steps, drafts        rows of finished requests only (rows whose request has no /requests row
                       belong to a request still running or cut short by a crash: the schema says
                       readers drop them; `Run.dropped` counts them, `keep_unfinished=True` keeps
                       them); steps also leaves out the steps that drafted nothing (one position
                       short of the context limit: no verify step), counted in
                       `Run.dropped["undrafted_steps"]`, and the steps whose verify logits were
                       not finite (steps.nonfinite: they verified nothing) with their drafts,
                       counted in `Run.dropped["nonfinite_steps"]` and `["nonfinite_drafts"]`
  nonfinite_steps      those non-finite steps' rows (columns as steps)
  requests, kernels, ranges, sessions, strings
Enum fields (channel, stop_reason, phase, status, trace_level) are pandas Categoricals of their
names, in code order. Joined columns, for grouping:
  steps, drafts:  sweep_batch (the request's concurrency B), category_name, turn (drafts)
  requests:       category_name, conversation_name
  kernels:        kernel_name
`Run.experts` is steps.distinct_experts as an (n_steps, 64) array aligned with `Run.steps`.
`Run.string_texts` holds every /strings text decoded, indexed by id; a text the writer cut (longer
than a row holds) ends with an ellipsis there and in the joined names.
"""
import builtins
import os

import h5py
import numpy as np
import pandas as pd

from . import schema


class DraftscopeFormatError(ValueError):
    """The file is not a run file this package can read; the message names the file and why."""


def _decode(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist() if v.ndim else v.item()
    if isinstance(v, np.generic):
        return v.item()
    return v


def _present(name, field, version):
    """Whether a file of this schema version has the field (older ones lack later additions)."""
    return version >= schema.ADDED_IN.get((name, field), 1)


def _check_table(path, name, dset, version):
    want = [w for w in schema.TABLES[name] if _present(name, w[0], version)]
    dt = dset.dtype
    if dt.names is None:
        raise DraftscopeFormatError(f"{path}: table /{name} is not a table of records")
    names = list(dt.names)
    missing = [f for f, _, _ in want if f not in names]
    if missing:
        raise DraftscopeFormatError(
            f"{path}: table /{name} lacks field(s) {', '.join(missing)} "
            f"(this package reads schema version {schema.SCHEMA_VERSION})")
    for field, code, _ in want:
        got = dt.fields[field][0]
        base = got.base if got.subdtype is None else got.subdtype[0]
        want_dt = np.dtype(code)
        want_base = want_dt if want_dt.subdtype is None else want_dt.subdtype[0]
        if base.kind != want_base.kind or base.itemsize != want_base.itemsize or \
                got.shape != want_dt.shape:
            raise DraftscopeFormatError(
                f"{path}: /{name}.{field} has type {got}, expected {want_dt}")


class Run:
    """An open run file. Use as a context manager or call close()."""

    def __init__(self, path, keep_unfinished=False):
        self.path = os.fspath(path)
        self.keep_unfinished = keep_unfinished
        self._truncated = None  # the error to give if a truncated file's session did not fail
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"{self.path}: no such file")
        if os.path.isdir(self.path) or os.path.getsize(self.path) == 0:
            what = "a directory" if os.path.isdir(self.path) else "an empty file"
            raise DraftscopeFormatError(f"{self.path}: {what}, not a run file")
        if not h5py.is_hdf5(self.path):
            raise DraftscopeFormatError(f"{self.path}: not an HDF5 file")
        self._f = self._open_file()
        try:
            self._read_meta()
            self._raw = {}
            for name in schema.TABLES:
                if name not in self._f:
                    raise DraftscopeFormatError(
                        f"{self.path}: not a draftscope run file: no table /{name}")
                _check_table(self.path, name, self._f[name], self.schema_version)
                self._raw[name] = self._f[name][()]
            # Only a failed write explains a file shorter than it records; a copy cut short
            # does not (the missing bytes, read as zeros, would pass for rows).
            status = self._raw["sessions"]["status"]
            if self._truncated and (not len(status) or
                                    status[-1] != schema.ENUMS["status"].index("failed")):
                raise DraftscopeFormatError(self._truncated)
            self._build()
        except (KeyError, OSError, RuntimeError) as e:
            # HDF5's own failures (a damaged file): one line naming the file.
            self._f.close()
            raise DraftscopeFormatError(self._truncated or f"{self.path}: cannot read: {e}") \
                from None
        except Exception:
            self._f.close()
            raise

    def _open_file(self):
        # A closed file opens plainly. A file being written, or whose writer died, carries "open
        # for write" marks that a plain open refuses (naming h5clear): those open in SWMR mode.
        # Plain first, because a SWMR reader retries a block with a bad checksum for minutes (a
        # writer may be mid-write) and h5py cannot lower HDF5's attempt count.
        try:
            return h5py.File(self.path, "r")
        except OSError as e:
            msg = str(e)
            if "truncated file" in msg:
                return self._open_truncated(f"{self.path}: cannot open: {msg}")
            if "h5clear" not in msg and "open for write" not in msg and "already open" not in msg:
                raise DraftscopeFormatError(f"{self.path}: cannot open: {msg}") from None
        return h5py.File(self.path, "r", libver="latest", swmr=True)

    def _open_truncated(self, error):
        # A write stopped by a file-size limit leaves a superblock whose end of file lies past the
        # bytes on disk (docs/hdf5-schema.md), and the writer cannot extend the file under that
        # limit. Read it from memory as the extension would give it (zeros past the end), without
        # changing it; __init__ accepts it only when its last session failed (_truncated).
        with builtins.open(self.path, "rb") as fh:
            sb = fh.read(48)
            # The end-of-file address of a version 2/3 superblock with 8-byte addresses.
            if len(sb) < 48 or sb[8] not in (2, 3) or sb[9] != 8:
                raise DraftscopeFormatError(error)
            eof = int.from_bytes(sb[28:36], "little")
            size = os.fstat(fh.fileno()).st_size
            if eof > size:  # in bytes, as the C summary says it (not HDF5's "eof = ...")
                error = (f"{self.path}: truncated file: {size} bytes of the {eof} its superblock "
                         f"records (a copy cut short, or taken while the run wrote it)")
            if eof > size + (64 << 20):  # more than a few chunks
                raise DraftscopeFormatError(error)
            image = bytearray(eof)
            fh.seek(0)
            fh.readinto(image)
        try:
            f = h5py.File(h5py.h5f.open_file_image(image))
        except OSError:
            raise DraftscopeFormatError(error) from None
        self._truncated = error
        return f

    # ---- metadata ----

    def _read_meta(self):
        a = self._f.attrs
        # A damaged root header makes the lookup raise (reported as "cannot read"); attrs.get
        # would take that for an absent attribute and call the file no run file.
        h5py.h5a.exists(self._f.id, b"schema")
        if _decode(a.get("schema")) != schema.SCHEMA_NAME:
            raise DraftscopeFormatError(
                f"{self.path}: not a draftscope run file (no schema attribute "
                f"\"{schema.SCHEMA_NAME}\")")
        version = _decode(a.get("schema_version"))
        if version not in schema.READ_VERSIONS:
            raise DraftscopeFormatError(
                f"{self.path}: schema version {version}, this package reads versions "
                f"{', '.join(str(v) for v in schema.READ_VERSIONS)}")
        self.schema_version = int(version)
        self.meta = {k: _decode(v) for k, v in a.items()}
        self._check_attr_kinds()
        k = self.meta.get("k", 0)
        if k != int(k) or not 1 <= k <= 255:
            raise DraftscopeFormatError(
                f"{self.path}: attribute k = {k} is not an integer in 1..255")
        self.k = int(k)

    def _check_attr_kinds(self):
        # A known attribute of the wrong kind (an array where one number belongs, a number where
        # text belongs: another tool's file, or a damaged one) is refused here by name, rather
        # than failing later in int() or float() with no file named.
        def one_number(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        def one_integer(v):  # as the C reader takes them: an integer type, not 3.0
            return isinstance(v, int) and not isinstance(v, bool)
        for name, ok, what in ([(n, one_integer if n in schema.INTEGER_ATTRS else one_number,
                                 "one integer" if n in schema.INTEGER_ATTRS else "one number")
                                for n in schema.NUMBER_ATTRS] +
                               [(n, lambda v: isinstance(v, str), "one string")
                                for n in schema.STRING_ATTRS] +
                               [(n, lambda v: isinstance(v, list) and all(map(one_number, v)),
                                 "a list of numbers") for n in schema.ARRAY_ATTRS]):
            if name in self.meta and not ok(self.meta[name]):
                raise DraftscopeFormatError(
                    f"{self.path}: attribute {name} is not {what} ({self.meta[name]!r:.60})")

    # ---- tables ----

    def _strings(self):
        """Every /strings text, decoded; one the writer cut (its `length` is larger than the
        bytes stored) ends with an ellipsis, as the C summary's labels do."""
        s = self._raw["strings"]
        texts = [t.decode("utf-8", "replace") + ("\u2026" if int(n) > len(t) else "")
                 for t, n in zip(s["text"], s["length"])]
        return np.array(texts, dtype=object)

    def _frame(self, name, skip=()):
        raw = self._raw[name]
        cols = {}
        for field, code, enum in schema.TABLES[name]:
            if field in skip:
                continue
            if not _present(name, field, self.schema_version):
                cols[field] = np.zeros(len(raw), dtype=code)  # an older file: the field reads 0
                continue
            v = raw[field]
            if enum:
                names = schema.ENUMS[enum]
                codes = v.astype(np.int16)
                codes = np.where(codes < len(names), codes, -1)
                cols[field] = pd.Categorical.from_codes(codes, categories=names)
            elif field == "text":
                cols[field] = [t.decode("utf-8", "replace") for t in v]
            else:
                cols[field] = v
        return pd.DataFrame(cols)

    def _build(self):
        strings = self.string_texts = self._strings()

        def text_of(ids):
            ids = np.asarray(ids, dtype=np.int64)
            out = np.full(len(ids), "", dtype=object)
            ok = ids < len(strings)
            out[ok] = strings[ids[ok]]
            return out

        self.strings = self._frame("strings")
        self.sessions = self._frame("sessions")
        if len(self.sessions):
            self.sessions["command_line_text"] = text_of(self.sessions["command_line"])
        req = self._frame("requests")
        req["category_name"] = text_of(req["category"])
        req["conversation_name"] = text_of(req["conversation"])
        self._check_written("requests", req)
        dups = req["request"][req["request"].duplicated()]
        if len(dups):
            raise DraftscopeFormatError(
                f"{self.path}: /requests has request id {int(dups.iloc[0])} twice")
        self.requests = req

        steps = self._frame("steps", skip=("distinct_experts",))
        experts = self._raw["steps"]["distinct_experts"]
        drafts = self._frame("drafts")
        self._check_rows(steps, drafts)
        finished_steps = steps["request"].isin(req["request"]).to_numpy()
        finished_drafts = drafts["request"].isin(req["request"]).to_numpy()
        self.dropped = {"steps": int((~finished_steps).sum()),
                        "drafts": int((~finished_drafts).sum())}
        if not self.keep_unfinished:
            steps = steps[finished_steps].reset_index(drop=True)
            experts = experts[finished_steps]
            drafts = drafts[finished_drafts].reset_index(drop=True)
        # A step that drafted nothing (one position short of the context limit) is no verify
        # step: left out of steps, and so of every step metric, and counted (as the C summary).
        drafted = (steps["drafted"] > 0).to_numpy()
        self.dropped["undrafted_steps"] = int((~drafted).sum())
        steps = steps[drafted].reset_index(drop=True)
        experts = experts[drafted]
        # A step whose verify logits were not finite verified nothing (its request ended with
        # error): it and its drafts are left out of every metric, as the C summary does. Its
        # rows stay readable in `nonfinite_steps`; the counts go to `dropped`.
        nf = (steps["nonfinite"] != 0).to_numpy()
        nf_keys = pd.MultiIndex.from_arrays([steps["request"][nf], steps["step"][nf]])
        nf_drafts = pd.MultiIndex.from_arrays([drafts["request"], drafts["step"]]).isin(nf_keys)
        self.dropped["nonfinite_steps"] = int(nf.sum())
        self.dropped["nonfinite_drafts"] = int(nf_drafts.sum())
        nonfinite = steps[nf].reset_index(drop=True)
        steps = steps[~nf].reset_index(drop=True)
        experts = experts[~nf]
        drafts = drafts[~nf_drafts].reset_index(drop=True)
        info = req.set_index("request")[["batch_size", "category_name", "turn"]]
        info = info.rename(columns={"batch_size": "sweep_batch"})
        steps = steps.join(info[["sweep_batch", "category_name"]], on="request")
        nonfinite = nonfinite.join(info[["sweep_batch", "category_name"]], on="request")
        drafts = drafts.join(info, on="request")
        self.steps, self.drafts, self.experts = steps, drafts, experts
        self.nonfinite_steps = nonfinite

        kernels = self._frame("kernels")
        kernels["kernel_name"] = text_of(kernels["name"])
        self.kernels = kernels
        self.ranges = self._frame("ranges")

    def _check_written(self, table, df):
        """The writer's batch sizes are 1 or more: a 0 is a row never written (zeros past the last
        flush of a file cut short, or copied while the run wrote it), refused as the C summary
        refuses it."""
        zero = np.flatnonzero(df["batch_size"].to_numpy() == 0)
        if len(zero):
            raise DraftscopeFormatError(
                f"{self.path}: /{table} row {int(zero[0])} has batch size 0: a row never written "
                f"(past the last flush: the file was cut short, or copied while the run wrote it)")

    def _check_rows(self, steps, drafts):
        k = self.k
        self._check_written("steps", steps)
        self._check_written("drafts", drafts)
        bad = (steps["drafted"] > k) | (steps["accepted"] > steps["drafted"]) | \
              (steps["emitted"].astype(int) > steps["accepted"].astype(int) + 1)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            r = steps.iloc[i]
            raise DraftscopeFormatError(
                f"{self.path}: /steps row {i}: drafted {r.drafted}, accepted {r.accepted}, "
                f"emitted {r.emitted} break accepted <= drafted <= k ({k}), "
                f"emitted <= accepted + 1")
        bad = (drafts["position"] < 1) | (drafts["position"] > k) | (drafts["accepted"] > 1) | \
              drafts["channel"].isna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DraftscopeFormatError(
                f"{self.path}: /drafts row {i}: position, accepted or channel out of range")

    # ---- live files ----

    def refresh(self):
        """Reads the rows flushed since the last read (SWMR); returns the new row counts."""
        for name in schema.TABLES:
            d = self._f[name]
            if hasattr(d, "refresh"):
                try:
                    d.refresh()
                except (OSError, RuntimeError, ValueError):
                    pass  # not opened in SWMR mode: the file is not growing
            n_old = len(self._raw[name])
            if name == "sessions":  # rows are rewritten in place: read all again
                self._raw[name] = d[()]
            elif d.shape[0] > n_old:
                self._raw[name] = np.concatenate([self._raw[name], d[n_old:]])
        self._build()
        return {name: len(self._raw[name]) for name in schema.TABLES}

    @property
    def is_running(self):
        """True when the last writer session is 'running': still writing, or its writer died."""
        return len(self.sessions) > 0 and self.sessions["status"].iloc[-1] == "running"

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"<draftscope.Run {self.path!r}: rule {self.meta.get('rule')}, K {self.k}, "
                f"{len(self.steps)} steps, {len(self.drafts)} drafts, "
                f"{len(self.requests)} requests>")


def open(path, keep_unfinished=False):  # noqa: A001 (the package's documented entry point)
    """Opens a run file read-only (SWMR); see the module docstring."""
    return Run(path, keep_unfinished=keep_unfinished)

"""The reader against files the C test suite writes: schema mirror, values, crashed and live
files, refusals."""
import os
import re
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import draftscope
from draftscope import schema

from conftest import ROOT, summary_command, tiny_run_args

RECORD_H = os.path.join(ROOT, "profiler", "include", "ds", "record.h")
C_TYPES = {"uint64_t": "u8", "uint32_t": "u4", "uint16_t": "u2", "uint8_t": "u1",
           "int32_t": "i4", "float": "f4", "double": "f8", "char": "S1"}


def _header():
    with open(RECORD_H) as f:
        return f.read()


def _struct_fields(text, name):
    """(field, numpy dtype) of `struct ds_rec_<name>` in record.h, comments removed."""
    body = re.search(r"struct ds_rec_%s \{(.*?)\n\};" % name, text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    out = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        ctype, rest = decl.split(None, 1)
        for var in rest.split(","):
            var = var.strip()
            m = re.match(r"(\w+)(?:\[(\w+)\])?$", var)
            out.append((m.group(1), C_TYPES[ctype], m.group(2)))
    return out


def test_schema_version_matches_record_h():
    text = _header()
    v = int(re.search(r"#define DS_RECORD_SCHEMA_VERSION (\d+)u", text).group(1))
    assert v == schema.SCHEMA_VERSION == draftscope.SCHEMA_VERSION
    assert re.search(r'#define DS_RECORD_SCHEMA_NAME "([^"]+)"', text).group(1) == \
        schema.SCHEMA_NAME
    assert int(re.search(r"#define DS_RECORD_MAX_LAYERS (\d+)", text).group(1)) == \
        schema.MAX_LAYERS
    assert int(re.search(r"#define DS_RECORD_STRING_BYTES (\d+)", text).group(1)) == \
        schema.STRING_BYTES


@pytest.mark.parametrize("table", list(schema.TABLES))
def test_fields_mirror_record_h(table):
    struct = {"drafts": "draft", "steps": "step", "requests": "request", "kernels": "kernel",
              "ranges": "range", "strings": "string", "sessions": "session"}[table]
    c_fields = _struct_fields(_header(), struct)
    assert [f for f, _, _ in c_fields] == schema.field_names(table)
    for (name, code, _), (_, want, _) in zip(c_fields, schema.TABLES[table]):
        if name in ("distinct_experts", "text"):
            continue  # arrays: checked against the file below
        assert np.dtype(code) == np.dtype(want), name


@pytest.mark.parametrize("table", list(schema.TABLES))
def test_file_tables_match_the_reader(samples, table):
    """Field names, dtypes and row sizes of every table of a file written by test_record."""
    with h5py.File(samples["closed"], "r") as f:
        dt = f[table].dtype
        assert list(dt.names) == schema.field_names(table)
        assert dt.itemsize == schema.ROW_BYTES[table]
        for field, code, enum in schema.TABLES[table]:
            got = dt.fields[field][0]
            assert got == np.dtype(code) or (enum and got.kind == "u" and got.itemsize == 1), field
            if enum:
                names = h5py.check_enum_dtype(got)
                assert names == {n: i for i, n in enumerate(schema.ENUMS[enum])}, field


def test_reads_the_record_sample(samples):
    """Values are the closed forms tests/test_record.c writes (make_draft, make_step, ...)."""
    with draftscope.open(samples["closed"]) as run:
        assert run.meta["schema"] == "draftscope-run"
        assert run.meta["rule"] == "greedy" and run.k == 3 and run.meta["seed"] == 1234
        assert list(run.meta["batch_sizes"]) == [1, 8, 32]
        i = np.arange(100)
        assert len(run.requests) == 100
        # make_step marks every fifth step non-finite: those 20 verified nothing, so they are
        # kept apart (their drafts would be too: make_draft's step ids match none of them).
        assert run.dropped == {"steps": 0, "drafts": 0, "undrafted_steps": 0,
                               "nonfinite_steps": 20, "nonfinite_drafts": 0}
        kept = i[i % 5 != 0]
        assert (run.steps["step"].to_numpy() == 5000 + kept).all()
        assert (run.nonfinite_steps["step"].to_numpy() == 5000 + i[i % 5 == 0]).all()
        assert (run.steps["nonfinite"] == 0).all()
        d = run.drafts
        assert (d["step"].to_numpy() == 1000 + i // 3).all()
        assert (d["q_draft"].to_numpy() == np.float32(1) / (i + 2).astype(np.float32)).all()
        assert list(d["channel"][:5]) == schema.ENUMS["channel"]
        assert (run.experts[:, 5] == (kept + 5) % 129).all()
        assert (run.experts[:, 36:] == 0).all()
        assert len(run.kernels) == 100 and len(run.ranges) == 100
        assert run.requests["category_name"].iloc[0] == ""
        assert run.strings["text"].iloc[0] == ""
        assert not run.is_running


def test_reads_a_version_1_file(samples, tmp_path):
    """A v1 file (no sessions.trace_dropped) is the v2 sample with that column removed and
    schema_version 1: it reads, with trace_dropped 0, and its other values are unchanged."""
    v1 = str(tmp_path / "v1.h5")
    shutil.copy(samples["sample"], v1)
    with h5py.File(v1, "r+") as f:
        se = f["sessions"][()]
        names = [n for n in se.dtype.names if n != "trace_dropped"]
        old = np.empty(len(se), dtype=[(n, se.dtype.fields[n][0]) for n in names])
        for n in names:
            old[n] = se[n]
        del f["sessions"]
        f.create_dataset("sessions", data=old, maxshape=(None,))
        f.attrs["schema_version"] = np.uint32(1)
    with draftscope.open(v1) as run, draftscope.open(samples["sample"]) as run2:
        assert run.schema_version == 1 and run2.schema_version == 2
        assert (run.sessions["trace_dropped"] == 0).all()
        assert (run2.sessions["trace_dropped"] == 7).all()  # test_summary.c write_sample
        assert list(run.sessions["status"]) == list(run2.sessions["status"])
        assert len(run.drafts) == len(run2.drafts)


def test_killed_writer_file(samples):
    """The killed writer's file opens (SWMR) as it is; its drafts belong to requests that never
    finished, so they are dropped unless asked for."""
    with draftscope.open(samples["killed"]) as run:
        assert run.is_running
        assert len(run.drafts) == 0 and run.dropped["drafts"] >= 100
    with draftscope.open(samples["killed"], keep_unfinished=True) as run:
        assert len(run.drafts) >= 100
        assert (run.drafts["step"].to_numpy()[:100] == 1000 + np.arange(100) // 3).all()


def test_refresh_sees_a_live_file_grow(programs, tmp_path):
    path = tmp_path / "live.h5"
    p = subprocess.Popen([programs["summary"], "--write-live", str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        run = draftscope.open(path)
        assert run.is_running
        assert len(run.requests) == 0
        assert run.dropped == {"steps": 8, "drafts": 23, "undrafted_steps": 0,
                               "nonfinite_steps": 0, "nonfinite_drafts": 0}
        p.stdin.write("next\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "ready"
        counts = run.refresh()
        assert counts["requests"] == 3
        assert len(run.steps) == 7
        assert run.dropped == {"steps": 1, "drafts": 3, "undrafted_steps": 0,
                               "nonfinite_steps": 0, "nonfinite_drafts": 0}
        p.stdin.write("next\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "ready"
        run.refresh()
        assert len(run.steps) == 14 and len(run.drafts) == 40
        run.close()
    finally:
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    with draftscope.open(path) as run:
        assert not run.is_running and len(run.steps) == 14


def test_refusals(samples, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        draftscope.open(tmp_path / "missing.h5")
    text = tmp_path / "text.h5"
    text.write_text("not hdf5\n")
    with pytest.raises(draftscope.DraftscopeFormatError, match="text.h5: not an HDF5 file"):
        draftscope.open(text)
    (tmp_path / "empty.h5").write_bytes(b"")
    with pytest.raises(draftscope.DraftscopeFormatError, match="empty.h5: an empty file, not a"):
        draftscope.open(tmp_path / "empty.h5")
    (tmp_path / "dir.h5").mkdir()
    with pytest.raises(draftscope.DraftscopeFormatError, match="dir.h5: a directory, not a run"):
        draftscope.open(tmp_path / "dir.h5")
    plain = tmp_path / "plain.h5"
    h5py.File(plain, "w").close()
    with pytest.raises(draftscope.DraftscopeFormatError, match="not a draftscope run file"):
        draftscope.open(plain)
    v2 = tmp_path / "v2.h5"
    shutil.copy(samples["closed"], v2)
    with h5py.File(v2, "r+") as f:
        f.attrs.modify("schema_version", np.uint32(3))
    with pytest.raises(draftscope.DraftscopeFormatError,
                       match="schema version 3, this package reads versions 1, 2"):
        draftscope.open(v2)
    # Known attributes of the wrong kind are refused by name, not left to fail in int() or
    # float() later (a TypeError naming no file, before this check).
    bad = tmp_path / "bad_attr.h5"
    for name, value, says in [
            ("k", np.array([3, 3, 3], dtype=np.uint32), "attribute k is not one integer"),
            ("k", np.float64(3.5), "attribute k is not one integer"),
            ("k", np.float64(np.inf), "attribute k is not one integer"),  # OverflowError before
            ("k", np.uint32(0), r"attribute k = 0 is not an integer in 1\.\.255"),
            ("temperature", np.array([0.0, 1.0]), "attribute temperature is not one number"),
            ("seed", b"1234", "attribute seed is not one integer"),
            ("seed", np.float64(np.nan), "attribute seed is not one integer"),
            ("rule", np.int32(1), "attribute rule is not one string"),
            ("batch_sizes", b"1,8", "attribute batch_sizes is not a list of numbers")]:
        shutil.copy(samples["closed"], bad)
        with h5py.File(bad, "r+") as f:
            del f.attrs[name]
            f.attrs[name] = value
        with pytest.raises(draftscope.DraftscopeFormatError, match=f"bad_attr.h5: ({says})"):
            draftscope.open(bad)


@pytest.mark.parametrize("table", ["requests", "steps", "drafts"])
def test_unwritten_rows_refused_as_the_summary_does(programs, samples, tmp_path, table):
    """A row of batch size 0 was never written (zeros past the last flush of a cut copy): both
    readers refuse the file, naming the table and the row."""
    bad = tmp_path / f"zero_{table}.h5"
    shutil.copy(samples["closed"], bad)
    with h5py.File(bad, "r+") as f:
        rows = f[table][()]
        rows["batch_size"][2] = 0
        f[table][...] = rows
    says = f"zero_{table}.h5: /{table} row 2 has batch size 0: a row never written"
    with pytest.raises(draftscope.DraftscopeFormatError, match=says):
        draftscope.open(bad)
    c = subprocess.run(summary_command(programs) + [str(bad)], capture_output=True, text=True)
    assert c.returncode == 1 and says in c.stderr, c.stderr


def test_damaged_attributes_are_named(samples, tmp_path):
    """Damaged attribute storage (the root's attributes live in a fractal heap) fails the
    attribute lookup itself; that was taken for an absent schema attribute and reported as
    "not a draftscope run file"."""
    bad = tmp_path / "damaged_attrs.h5"
    shutil.copy(samples["closed"], bad)
    with open(bad, "r+b") as f:
        at = f.read().find(b"FRHP")  # the fractal heap header's signature
        assert at > 0
        f.seek(at)
        f.write(b"XXXX")
    with pytest.raises(draftscope.DraftscopeFormatError) as e:
        draftscope.open(bad)
    assert "damaged_attrs.h5: cannot read: " in str(e.value)
    assert "not a draftscope run file" not in str(e.value)


def _stored_eof(path):
    with open(path, "rb") as f:
        return int.from_bytes(f.read(36)[28:36], "little")


def test_file_size_limit_file_reads_as_failed(programs, samples, tmp_path):
    """`draftscope run` stopped by a file-size limit cannot extend its file to the end the
    superblock records, so h5py refused it as a "truncated file". It reads as it is (session
    failed, nothing changed), with the numbers of the C summary; a copy cut short is refused."""
    if not programs.get("draftscope"):
        pytest.skip("the draftscope executable is not built")
    import resource
    from test_metrics import _c_summary, _same
    out = tmp_path / "fsize.h5"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (400 * 1024, 400 * 1024))
    args = tiny_run_args(programs, tmp_path / "conv.jsonl", out,
                         [("a", "hello world"), ("b", "hell or held"), ("c", "world")],
                         ["--batch-sizes", "1,2", "--max-new-tokens", "60"])
    p = subprocess.run(args, preexec_fn=limit, capture_output=True, text=True)
    assert p.returncode == 1 and "File too large" in p.stderr, p.stderr
    size = os.path.getsize(out)
    assert size < _stored_eof(out)
    with open(out, "rb") as f:
        before = f.read()
    with draftscope.open(out) as run:
        assert run.sessions["status"].iloc[-1] == "failed"
        for by in ("batch", "step-batch"):
            py = draftscope.summary_dict(run, by)
            c = _c_summary(programs, out, by)
            c.pop("file")
            py.pop("file")
            _same(c, py, by)
    with open(out, "rb") as f:
        assert f.read() == before

    # A closed run's copy cut short is no failed write: still refused, in bytes as the C summary
    # says it (it was HDF5's "truncated file: eof = ..., stored_eof = ...").
    cut = tmp_path / "cut.h5"
    shutil.copy(samples["closed"], cut)
    whole = os.path.getsize(cut)
    os.truncate(cut, whole - 1000)
    want = (f"cut.h5: truncated file: {whole - 1000} bytes of the {whole} its superblock records "
            f"(a copy cut short, or taken while the run wrote it)")
    with pytest.raises(draftscope.DraftscopeFormatError, match=re.escape(want)):
        draftscope.open(cut)
    c = subprocess.run(summary_command(programs) + [str(cut)], capture_output=True, text=True)
    assert c.returncode == 1 and want in c.stderr

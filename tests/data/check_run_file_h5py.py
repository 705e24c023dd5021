#!/usr/bin/env python3
"""Reads the sample run files that `test_record --write-samples DIR` writes, with h5py, and checks
them against docs/hdf5-schema.md: names, sizes, enums, attributes, values, SWMR reading of a file
whose writer was killed.

Usage: check_run_file_h5py.py DIR      (exit 0 ok, 1 failure, 77 h5py missing: skipped)

Expected values are recomputed here from the closed forms the C test writes (make_draft etc. in
tests/test_record.c), in numpy float32 where the C code computes in float, so equality is exact.
"""
import sys

try:
    import h5py
    import numpy as np
except ImportError:
    print("skipped: h5py/numpy not installed")
    sys.exit(77)

N = 100
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what)


FIELDS = {
    "drafts": (64, ["step", "request", "draft_token", "q_draft", "p_draft", "target_token",
                    "p_target", "margin", "expected_accept", "entropy_target", "entropy_draft",
                    "context_len", "batch_size", "position", "accepted", "channel"]),
    "steps": (184, ["step", "draft_ns", "verify_ns", "accept_ns", "total_ns", "request",
                    "context_len", "batch_size", "turn", "drafted", "accepted", "emitted",
                    "nonfinite", "distinct_experts"]),
    "requests": (56, ["start_ns", "end_ns", "request", "dataset_index", "category",
                      "conversation", "prompt_len", "generated_len", "steps", "batch_size", "turn",
                      "session", "stop_reason"]),
    "kernels": (80, ["step", "start_ns", "end_ns", "graph_node", "name", "stream", "grid_x",
                     "grid_y", "grid_z", "block_x", "block_y", "block_z", "static_smem",
                     "dynamic_smem", "correlation", "registers", "phase", "draft_step"]),
    "ranges": (32, ["step", "start_ns", "end_ns", "batch_size", "phase", "draft_step"]),
    "strings": (1024, ["id", "length", "text"]),
    "sessions": (56, ["start_unix_ns", "end_unix_ns", "first_step", "next_step",
                      "trace_overhead", "trace_dropped", "command_line", "session", "status",
                      "trace_level"]),
}
# Schema version 1 differs only in /sessions: no trace_dropped (8 bytes less).
FIELDS_V1 = dict(FIELDS, sessions=(48, [f for f in FIELDS["sessions"][1] if f != "trace_dropped"]))


def check_closed(path):
    with h5py.File(path, "r") as f:
        check(f.attrs["schema"] == "draftscope-run", "schema attribute")
        version = int(f.attrs["schema_version"])
        check(version in (1, 2), "schema_version")
        check(f.attrs["rule"] == "greedy", "rule is a str")
        check(int(f.attrs["seed"]) == 1234 and int(f.attrs["k"]) == 3, "seed, k")
        check(list(f.attrs["batch_sizes"]) == [1, 8, 32], "batch_sizes")
        for name, (size, fields) in (FIELDS if version >= 2 else FIELDS_V1).items():
            d = f[name]
            check(d.dtype.itemsize == size, f"{name} itemsize {d.dtype.itemsize} != {size}")
            check(list(d.dtype.names) == fields, f"{name} fields {d.dtype.names}")
            check(d.maxshape == (None,), f"{name} unlimited")
        ch = h5py.check_enum_dtype(f["drafts"].dtype["channel"])
        check(ch == {"header": 0, "analysis": 1, "commentary": 2, "final": 3, "other": 4},
              f"channel enum {ch}")
        st = h5py.check_enum_dtype(f["requests"].dtype["stop_reason"])
        check(st is not None and st["max_new_tokens"] == 3, f"stop_reason enum {st}")

        i = np.arange(N, dtype=np.uint64)
        d = f["drafts"][:]
        check(len(d) == N, "drafts rows")
        check((d["step"] == 1000 + i // 3).all(), "drafts.step")
        q = np.float32(1) / (i + 2).astype(np.float32)
        check((d["q_draft"] == q).all(), "drafts.q_draft")
        check((d["target_token"] == -(i % 11).astype(np.int64)).all(), "drafts.target_token")
        check((d["channel"] == i % 5).all(), "drafts.channel")
        s = f["steps"][:]
        check(s["distinct_experts"].shape == (N, 64), "steps.distinct_experts shape")
        check((s["distinct_experts"][:, 5] == (i + 5) % 129).all(), "steps.distinct_experts")
        check((s["distinct_experts"][:, 36:] == 0).all(), "unused layers are 0")
        check((s["total_ns"] == ((1 << 40) | i)).all(), "steps.total_ns")
        r = f["requests"][:]
        check((r["session"] == 0).all(), "requests.session")
        strings = f["strings"][:]
        texts = [t.decode() for t in strings["text"]]
        check(texts[0] == "" and texts[2] == "coding", f"strings {texts[:3]}")
        check((strings["id"] == np.arange(len(strings))).all(), "strings.id")
        se = f["sessions"][:]
        check(len(se) == 1 and se["status"][0] == 1, "session closed")
        check(np.isnan(se["trace_overhead"][0]), "trace_overhead NaN")
        if version >= 2:
            check(se["trace_dropped"][0] == 0, "trace_dropped 0 (not traced)")


def check_killed(path):
    # A dead writer's file opens with SWMR and holds exactly the flushed rows.
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        d = f["drafts"]
        d.refresh()
        check(d.shape == (N,), f"killed drafts shape {d.shape}")
        check(f["sessions"][0]["status"] == 0, "killed session still running")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    check_closed(f"{sys.argv[1]}/sample_closed.h5")
    check_killed(f"{sys.argv[1]}/sample_killed.h5")
    print(f"h5py {h5py.version.version}, HDF5 {h5py.version.hdf5_version}: "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

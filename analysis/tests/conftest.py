"""Fixtures: run files written by the C test programs, so the C writer and this reader are
tested against each other.

The ctest entries (tests/cmake/analysis.cmake) set DS_TEST_SUMMARY, DS_TEST_RECORD and
DS_DRAFTSCOPE to the built programs; run by hand, the programs are looked up in DS_BINARY_DIR or
in the build directories at the repository root.
"""
import glob
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _program(env, rel):
    p = os.environ.get(env)
    if p and os.path.exists(p):
        return p
    dirs = [os.environ["DS_BINARY_DIR"]] if os.environ.get("DS_BINARY_DIR") else []
    dirs += sorted(glob.glob(os.path.join(ROOT, "build*")), key=os.path.getmtime, reverse=True)
    for d in dirs:
        cand = os.path.join(d, rel)
        if os.path.exists(cand):
            return cand
    return None


@pytest.fixture(scope="session")
def programs():
    p = {"summary": _program("DS_TEST_SUMMARY", "tests/test_summary"),
         "record": _program("DS_TEST_RECORD", "tests/test_record"),
         "draftscope": _program("DS_DRAFTSCOPE", "profiler/draftscope")}
    if not p["summary"] or not p["record"]:
        pytest.skip("the C test programs are not built (build the tree, or set DS_BINARY_DIR)")
    return p


def run_c(args, **kw):
    """Runs a C program; its sanitizer settings come from the environment ctest sets."""
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def samples(programs, tmp_path_factory):
    d = tmp_path_factory.mktemp("samples")
    run_c([programs["summary"], "--write-sample", str(d / "sample.h5")])
    run_c([programs["summary"], "--write-sample", str(d / "untraced.h5"), "--untraced"])
    run_c([programs["record"], "--write-samples", str(d)])
    return {"sample": d / "sample.h5", "untraced": d / "untraced.h5",
            "closed": d / "sample_closed.h5", "killed": d / "sample_killed.h5", "dir": d}


def summary_command(programs):
    """The argv prefix of `draftscope summary`: the executable when it has the subcommand, else
    the test program that calls the same entry point (ds_cmd_summary)."""
    ds = programs.get("draftscope")
    if ds:
        out = subprocess.run([ds, "--help"], capture_output=True, text=True)
        if "summary" in out.stdout + out.stderr:
            return [ds, "summary"]
    return [programs["summary"], "--cmd", "summary"]


def tiny_run_args(programs, data, out, conversations, extra=()):
    """Writes `conversations` ((id, text) pairs) as a ShareGPT JSONL file at `data` and returns the
    argv of a CPU `draftscope run` of the tiny golden pair over it into `out`."""
    data.write_text("".join(
        '{"id": "%s", "conversations": [{"from": "human", "value": "%s"}]}\n' % (i, v)
        for i, v in conversations))
    golden = os.path.join(ROOT, "tests", "fixtures", "golden")
    return [programs["draftscope"], "run",
            "--target", os.path.join(golden, "tiny-gptoss-a"),
            "--draft", os.path.join(golden, "tiny-eagle3-a-lmsys"),
            "--tokenizer", os.path.join(ROOT, "tests", "data", "tiny_tokenizer.json"),
            "--dataset", str(data), "--device", "cpu", "--quiet", "--out", str(out), *extra]

"""python -m draftscope report RUN.h5 -o report.html | summary RUN.h5 [--json] [--by KEY]"""
import argparse
import json
import sys

from . import metrics, reader, report


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m draftscope",
                                description="Analyse a draftscope run file.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="write a self-contained HTML report")
    r.add_argument("run")
    r.add_argument("-o", "--output", default="report.html")
    r.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples (200)")
    r.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("summary", help="the metrics table (same numbers as draftscope summary)")
    s.add_argument("run")
    s.add_argument("--json", action="store_true")
    s.add_argument("--by", default="batch", choices=metrics.REQUEST_KEYS + metrics.ROW_KEYS)
    a = p.parse_args(argv)
    try:
        with reader.open(a.run) as run:
            if a.cmd == "report":
                report.write(run, a.output, n_boot=a.bootstrap, seed=a.seed)
                print(f"wrote {a.output}")
            elif a.json:
                json.dump(metrics.summary_dict(run, a.by), sys.stdout, indent=2)
                print()
            else:
                import pandas as pd
                with pd.option_context("display.width", 200, "display.max_columns", 50):
                    print(metrics.summary(run, a.by).to_string(float_format=lambda v: f"{v:.4f}"))
    except (OSError, ValueError) as e:
        print(f"draftscope: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

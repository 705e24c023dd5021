"""draftscope: read draftscope run files (HDF5) into DataFrames; acceptance metrics with bootstrap
confidence intervals; plots; a self-contained HTML report.

    import draftscope
    run = draftscope.open("run.h5")
    draftscope.summary(run, by="batch")
    draftscope.metric_ci(run, "conditional", by="batch", position=2)
"""
from .metrics import (METRICS, batch_divergence, compare, divergence, metric_ci,  # noqa: F401
                      per_position, request_sums, summary, summary_dict)
from .reader import DraftscopeFormatError, Run, open  # noqa: F401
from .schema import SCHEMA_VERSION  # noqa: F401
from . import plots, report  # noqa: F401

__version__ = "0.1.0"

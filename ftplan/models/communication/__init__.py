"""What communication adds to a data-parallel step on a cluster: links, collective costs, the step time and
the constants fitted to records.

One step on N = gpus_per_node x nodes ranks (each with the same micro-batch, so the per-step
overheads a single GPU pays, data loading, the optimizer step of an unpartitioned model and the
Python between kernels, stay whole on every rank; they never shrink with more GPUs) costs

    the slowest rank's compute  +  the collectives that do not hide behind backward  +  host transfers.

One job a module:
    links        the links' bandwidths and latencies (catalog, user figures, measurements, NCCL over TCP)
    collectives  one collective's cost after NCCL's tuner, and DDP's gradient buckets behind backward
    traffic      the bytes one step sends, and how many of their seconds stay exposed
    step         seconds per data-parallel step, stragglers and gradient accumulation included
    estimates    the step-time spread and the overlap, fitted to calibration records
    layout       the words for a layout of GPUs over nodes

The names below are re-exported so `from ftplan.models.communication import ...` keeps working
(ftplan/models/predictor.py imports them so); new code imports from the module that does the job.
"""

from ftplan.models.communication.collectives import (
    COLLECTIVE_BASE_LATENCY_S,
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    allreduce_seconds,
    collective_seconds,
    exposed_bucket_seconds,
    gradient_buckets,
    host_transfer_seconds,
    ring_seconds,
    tree_seconds,
)
from ftplan.models.communication.estimates import OverlapEstimate, estimate_overlap, step_time_cv
from ftplan.models.communication.layout import describe_layout
from ftplan.models.communication.links import (
    MAX_BANDWIDTH_GBS,
    MIN_BANDWIDTH_GBS,
    Links,
    NetworkLink,
    calibrated_links,
    find_link,
    links_from_catalog,
    load_network_catalog,
    parse_bandwidth,
    socket_sharing_factor,
)
from ftplan.models.communication.step import data_parallel_step_seconds, expected_max_normal, straggler_factor
from ftplan.models.communication.traffic import (
    DEFAULT_BACKWARD_FRACTION,
    DEFAULT_OVERLAP,
    StepTraffic,
    communication_seconds,
    exposed_communication_seconds,
    step_traffic,
)

__all__ = [
    "COLLECTIVE_BASE_LATENCY_S", "DDP_BUCKET_BYTES", "DDP_FIRST_BUCKET_BYTES", "DEFAULT_BACKWARD_FRACTION",
    "DEFAULT_OVERLAP", "MAX_BANDWIDTH_GBS", "MIN_BANDWIDTH_GBS", "Links", "NetworkLink", "OverlapEstimate",
    "StepTraffic", "allreduce_seconds", "calibrated_links", "collective_seconds", "communication_seconds",
    "data_parallel_step_seconds", "describe_layout", "estimate_overlap", "expected_max_normal",
    "exposed_bucket_seconds", "exposed_communication_seconds", "find_link", "gradient_buckets",
    "host_transfer_seconds", "links_from_catalog", "load_network_catalog", "parse_bandwidth", "ring_seconds",
    "socket_sharing_factor", "step_time_cv", "step_traffic", "straggler_factor", "tree_seconds",
]

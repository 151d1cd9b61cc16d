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
"""

"""The words every command prints for a layout of GPUs over nodes."""

from __future__ import annotations


def describe_layout(gpus_per_node: int, nodes: int) -> str:
    """'16 GPUs in all: 2 nodes × 8 GPUs', the words every command prints for a layout."""
    gpus = gpus_per_node * nodes
    if nodes == 1:
        return f"{gpus} GPU{'s' if gpus > 1 else ''} in all: one node"
    return f"{gpus} GPUs in all: {nodes} nodes × {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''}"

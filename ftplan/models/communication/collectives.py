"""What one collective costs over given links, after NCCL's own tuner, and how DDP's gradient buckets queue
behind backward.

Collectives follow the cost model of NCCL's own tuner (src/graph/tuning.cc, ncclTopoTuneModel and
ncclTopoGetAlgoTime): time = a base latency + hops x per-hop latency + bytes / bandwidth, where a
flat ring all-reduce takes 2(N-1) hops, 2(nodes-1) of them over the network, and moves
2(N-1)/N x bytes per link, and a tree takes 2((N/nodes - 1) + log2(nodes)) hops and moves 2 x bytes.
NCCL runs whichever is faster for the message size, so small messages at many ranks ride the tree
(latency-bound, logarithmic in the node count) and large ones the ring (bandwidth-bound).

PyTorch DDP all-reduces gradients in buckets (bucket_cap_mb, 25 MB; the first bucket 1 MiB) as
backward produces them, one bucket after another on one communication stream: only what is still
in flight when backward ends is exposed. LoRA's few megabytes of adapter gradients fill one bucket
that is ready only at the very end, so nearly all of their all-reduce is exposed; a full model's
gigabytes fill hundreds of buckets that mostly hide.
"""

from __future__ import annotations

import math

from ftplan.core.units import GB
from ftplan.models.communication.links import Links, socket_sharing_factor

# torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25), and the first bucket's 1 MiB
# (kDefaultFirstBucketBytes in torch/csrc/distributed/c10d/reducer.hpp; pytorch/pytorch#118421).
DDP_BUCKET_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20
# NCCL's base latency of a collective (tuning.cc baseLat, Ring/Simple, 8.4 us): the launch and
# synchronisation every all-reduce pays once, whatever its size and rank count.
COLLECTIVE_BASE_LATENCY_S = 8.4e-6


def _network_bandwidth(gpus_per_node: int, nodes: int, links: Links) -> float:
    """Bytes/s of the slowest link a multi-rank ring or tree crosses: the node's network link,
    shared by its GPUs (socket_sharing_factor over TCP), or the link inside the node."""
    if nodes == 1:
        return links.intra_node_gbs * GB
    inter = links.inter_node_gbs * (socket_sharing_factor(gpus_per_node) if links.inter_socket else 1.0)
    return min(inter, links.intra_node_gbs) * GB


def ring_seconds(nbytes: float, passes: int, gpus_per_node: int, nodes: int, links: Links) -> float:
    """A flat ring over every rank: passes=2 all-reduce, 1 all-gather or reduce-scatter.

    passes x (N-1) hops, passes x (nodes-1) of them over the network (tuning.cc nsteps, nInterSteps);
    each link carries passes x (N-1)/N x bytes, so the node's network link, shared by its GPUs, carries
    no more than one GPU's share.
    """
    ranks = gpus_per_node * nodes
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    hops, network_hops = passes * (ranks - 1), passes * (nodes - 1)
    latency = (COLLECTIVE_BASE_LATENCY_S + (hops - network_hops) * links.intra_latency_s
               + network_hops * links.inter_latency_s)
    return latency + passes * (ranks - 1) / ranks * nbytes / _network_bandwidth(gpus_per_node, nodes, links)


def tree_seconds(nbytes: float, gpus_per_node: int, nodes: int, links: Links) -> float:
    """NCCL's tree all-reduce: a chain inside each node, a binary tree across nodes, reduce then
    broadcast; 2 x ((GPUs per node - 1) + ceil(log2 nodes)) hops, 2 x bytes over the slowest link."""
    if gpus_per_node * nodes <= 1 or nbytes <= 0:
        return 0.0
    latency = (COLLECTIVE_BASE_LATENCY_S + 2 * (gpus_per_node - 1) * links.intra_latency_s
               + 2 * math.ceil(math.log2(nodes)) * links.inter_latency_s)
    return latency + 2 * nbytes / _network_bandwidth(gpus_per_node, nodes, links)


def collective_seconds(nbytes: float, passes: int, gpus_per_node: int, nodes: int, links: Links) -> float:
    """An all-reduce (passes=2: ring or tree, whichever is faster, as NCCL's tuner picks) or an
    all-gather / reduce-scatter (passes=1: ring)."""
    ring = ring_seconds(nbytes, passes, gpus_per_node, nodes, links)
    return min(ring, tree_seconds(nbytes, gpus_per_node, nodes, links)) if passes == 2 else ring


def allreduce_seconds(nbytes: float, gpus_per_node: int, nodes: int, links: Links) -> float:
    return collective_seconds(nbytes, 2, gpus_per_node, nodes, links)


def gradient_buckets(nbytes: int, bucket_bytes: int = DDP_BUCKET_BYTES,
                     first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """Bucket sizes in the order backward fills them: DDP's small first bucket, then full ones, the
    remainder last (the gradients of the first layers, ready when backward ends)."""
    if nbytes <= 0:
        return []
    sizes = [min(nbytes, first_bucket_bytes)]
    left = nbytes - sizes[0]
    while left > 0:
        sizes.append(min(left, bucket_bytes))
        left -= sizes[-1]
    return sizes


def _bucket_costs(sizes: list[int], passes: int, gpus_per_node: int, nodes: int, links: Links) -> dict[int, float]:
    """Each distinct bucket size's collective seconds, priced once: the buckets come in at most three sizes
    (first, full, remainder), and an 8B model's 640 buckets priced one by one made a 1..128-GPU plan take 12 s."""
    return {size: collective_seconds(size, passes, gpus_per_node, nodes, links) for size in set(sizes)}


def bucketed_seconds(nbytes: int, passes: int, gpus_per_node: int, nodes: int, links: Links,
                     bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Collective seconds of nbytes sent bucket by bucket, none hidden: each bucket pays its own latency."""
    sizes = gradient_buckets(nbytes, bucket_bytes)
    costs = _bucket_costs(sizes, passes, gpus_per_node, nodes, links)
    return sum(costs[size] for size in sizes)


def exposed_bucket_seconds(nbytes: int, backward_seconds: float, passes: int, gpus_per_node: int, nodes: int,
                           links: Links, bucket_bytes: int = DDP_BUCKET_BYTES) -> float:
    """Seconds of gradient collectives still running when backward ends.

    Gradients appear uniformly over backward; each bucket is launched when it is full and the
    previous one is done (one communication stream), and costs its own latency and bandwidth terms.
    """
    stream_free, produced = 0.0, 0
    sizes = gradient_buckets(nbytes, bucket_bytes)
    costs = _bucket_costs(sizes, passes, gpus_per_node, nodes, links)
    for size in sizes:
        produced += size
        ready = backward_seconds * produced / nbytes
        stream_free = max(stream_free, ready) + costs[size]
    return max(0.0, stream_free - backward_seconds)


def host_transfer_seconds(offloaded_bytes: int, ranks: int, links: Links) -> float:
    """Offload traffic of one rank: its partition of gradients and parameters over the host link.

    A single-GPU calibration with offload already contains host_transfer_seconds(bytes, 1, links).
    """
    return offloaded_bytes / ranks / (links.host_gbs * GB)

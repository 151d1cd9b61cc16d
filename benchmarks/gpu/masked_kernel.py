"""SDPA's masked attention alone, forward and backward, at the flattened lengths packing makes: is its cost per
FLOP constant in the length (the prior prices packing's extra attention at one masked-path rate per FLOP), and what
do the backends cost? One sequence of T tokens holding T/L rows of L tokens, masked block-diagonally and causally
as transformers' masking_utils masks a packed row for SDPA (a (1, 1, T, T) bool mask), K and V expanded to every
query head as transformers' sdpa_attention does under a mask; against the same rows side by side, masked (the
padded path) and unmasked (flash attention).

    python benchmarks/gpu/masked_kernel.py HEADS HEAD_DIM L K1,K2,...   # on the GPU; one JSON line per case
"""

from __future__ import annotations

import json
import sys
import time


def block_causal_mask(rows: int, length: int, device: str):
    """(1, 1, T, T) bool: True where a query may attend a key (same row, not after it)."""
    import torch

    position = torch.arange(rows * length, device=device)
    row = position // length
    return ((row[:, None] == row[None, :]) & (position[:, None] >= position[None, :]))[None, None]


def timed(function, repeats: int = 5) -> tuple[float, float]:
    """(seconds of the first call, which builds any kernel plan, and the median of the next `repeats`)."""
    import torch

    seconds = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        function()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds[0], sorted(seconds[1:])[repeats // 2]


def case(heads: int, head_dim: int, length: int, k: int) -> dict:
    """One flattened length: the masked kernel under each backend, and the same rows side by side."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    total = k * length
    q, key, value = (torch.randn(1, heads, total, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                     for _ in range(3))
    mask = block_causal_mask(k, length, "cuda")
    causal_rows = block_causal_mask(1, length, "cuda").expand(k, 1, length, length)
    split = [t.view(1, heads, k, length, head_dim).transpose(1, 2).reshape(k, heads, length, head_dim)
             for t in (q, key, value)]
    everything = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                  SDPBackend.MATH]

    def attention(backends, tensors, **kwargs):
        def step():
            with sdpa_kernel(backends):
                F.scaled_dot_product_attention(*tensors, **kwargs).sum().backward(retain_graph=True)
        return step

    row = {"heads": heads, "head_dim": head_dim, "length": length, "k": k, "tokens": total,
           # the full square's score and value products, forward and backward (2.5 times forward)
           "full_square_tflop": 4 * total * total * heads * head_dim * 3.5 / 1e12}
    steps = {"default": attention(everything, (q, key, value), attn_mask=mask),        # what packing runs
             "efficient": attention([SDPBackend.EFFICIENT_ATTENTION], (q, key, value), attn_mask=mask),
             "rows_masked": attention(everything, split, attn_mask=causal_rows),       # the padded, masked path
             "rows_flash": attention([SDPBackend.FLASH_ATTENTION], split, is_causal=True)}  # unmasked rows
    for name, step in steps.items():
        try:
            row[f"{name}_first_s"], row[f"{name}_s"] = timed(step)
        except RuntimeError as error:  # a backend that refuses the case, or memory
            row[f"{name}_error"] = str(error).splitlines()[0][:160]
        q.grad = key.grad = value.grad = None
    return row


def main(heads: int, head_dim: int, length: int, ks: list[int]) -> None:
    import torch

    for k in ks:
        print(json.dumps(case(heads, head_dim, length, k)), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), [int(k) for k in sys.argv[4].split(",")])

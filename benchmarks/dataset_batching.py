"""Predicted vs measured padded tokens per micro-batch for dynamic padding, group_by_length and packing,
on a real text corpus available offline: the long descriptions (README text) in the METADATA of every
Python package installed in this environment, tokenized by a byte-level BPE trained on that corpus.

Measured = the mean padded length of the batches a real torch DataLoader yields (RandomSampler with
dynamic padding; transformers' LengthGroupedSampler for group_by_length) over several epochs with different
seeds; for packing, the rows best-fit decreasing produces are counted directly. Run:
    python benchmarks/dataset_batching.py
"""

from __future__ import annotations

import sys
from importlib import metadata

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from ftplan.models.batching import apply_limit, batching

MAX_LENGTH = 8192


def corpus() -> list[str]:
    texts = []
    for dist in metadata.distributions():
        body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if len(body.strip()) > 20:
            texts.append(body)
    return texts


def main() -> None:
    texts = corpus()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, show_progress=False))
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    limited = apply_limit(lengths, MAX_LENGTH, "truncate").lengths
    print(f"corpus: {len(texts)} package descriptions, {lengths.sum():,} tokens, p50 {np.median(lengths):.0f}, "
          f"max {lengths.max()}, {int((lengths > MAX_LENGTH).sum())} over {MAX_LENGTH} truncated")
    print(f"{'strategy':10} {'batch':>5} {'predicted':>10} {'measured':>10} {'error':>7}")
    from transformers.trainer_pt_utils import LengthGroupedSampler
    for b in (2, 8):
        for strategy in ("dynamic", "group"):
            predicted = batching(strategy, limited, b).time_length
            measured = []
            for seed in range(20):
                generator = torch.Generator().manual_seed(seed)
                sampler = (torch.utils.data.RandomSampler(range(len(limited)), generator=generator)
                           if strategy == "dynamic" else
                           LengthGroupedSampler(b, lengths=limited.tolist(), generator=generator))
                loader = torch.utils.data.DataLoader(list(range(len(limited))), batch_size=b, sampler=sampler,
                                                     drop_last=True,
                                                     collate_fn=lambda idx: max(limited[i] for i in idx))
                measured += list(loader)
            actual = float(np.mean(measured))
            print(f"{strategy:10} {b:5d} {predicted:10.1f} {actual:10.1f} {predicted / actual - 1:+7.1%}")
    packed = batching("pack", limited, 1, pack_length=MAX_LENGTH)
    print(f"pack {MAX_LENGTH}: {packed.rows} rows, {packed.real_tokens_per_row:.0f} real tokens per row "
          f"({1 - packed.padding_fraction:.1%} full); lower bound ceil(tokens / row) = "
          f"{-(-int(limited.sum()) // MAX_LENGTH)} rows")


if __name__ == "__main__":
    sys.exit(main())

"""The prior's eager-attention traffic is transformers' own: every op of eager_attention_forward (forward and
backward) recounted through torch's dispatcher, bytes read and written per score element."""

from __future__ import annotations

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.settings import Setting
from ftplan.models.traffic import (
    EAGER_BACKWARD_BYTES_PER_SCORE,
    EAGER_FORWARD_BYTES_PER_SCORE,
    SOFTCAP_BACKWARD_BYTES_PER_SCORE,
    SOFTCAP_FORWARD_BYTES_PER_SCORE,
    eager_attention_bytes,
)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

BATCH, HEADS, KV_HEADS, SEQ, HEAD_DIM = 2, 4, 2, 64, 16


def _score_traffic(eager_attention_forward, **kwargs) -> tuple[float, float]:
    """(forward, backward) bytes per score element that ops touching a score-sized tensor read and write; views
    and in-place aliases move nothing and are skipped."""
    from tests.dispatch_traffic import Traffic

    scores = BATCH * HEADS * SEQ * SEQ

    class Module(torch.nn.Module):
        num_key_value_groups, head_dim = HEADS // KV_HEADS, HEAD_DIM

    query = torch.randn(BATCH, HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
    key, value = (torch.randn(BATCH, KV_HEADS, SEQ, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
                  for _ in range(2))
    mask = torch.zeros(BATCH, 1, SEQ, SEQ, dtype=torch.bfloat16)
    with Traffic(min_numel=scores) as forward:
        output, _ = eager_attention_forward(Module().train(), query, key, value, mask, dropout=0.0,
                                            scaling=HEAD_DIM**-0.5, **kwargs)
    loss = output.float().sum()
    with Traffic(min_numel=scores) as backward:
        loss.backward()
    return forward.bytes / scores, backward.bytes / scores


def test_llama_eager_attention_moves_what_the_prior_counts():
    from transformers.models.llama.modeling_llama import eager_attention_forward

    assert _score_traffic(eager_attention_forward) == (EAGER_FORWARD_BYTES_PER_SCORE,
                                                      EAGER_BACKWARD_BYTES_PER_SCORE)


def test_gemma2_softcapped_eager_attention_moves_what_the_prior_counts():
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    assert _score_traffic(eager_attention_forward, softcap=50.0) == (
        EAGER_FORWARD_BYTES_PER_SCORE + SOFTCAP_FORWARD_BYTES_PER_SCORE,
        EAGER_BACKWARD_BYTES_PER_SCORE + SOFTCAP_BACKWARD_BYTES_PER_SCORE)


def test_only_eager_attention_pays_score_traffic_and_checkpointing_pays_the_forward_twice():
    arch = load_architecture("gemma-2-2b")
    eager = Setting("gemma-2-2b", lora_rank=16, attention="eager")
    assert eager_attention_bytes(arch, eager.with_(attention="sdpa")) == 0
    per_pass = arch.layers * arch.heads * eager.seq_len**2
    assert eager_attention_bytes(arch, eager) == per_pass * 94
    assert eager_attention_bytes(arch, eager.with_(gradient_checkpointing=True)) == per_pass * (94 + 44)

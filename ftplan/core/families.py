"""What each decoder family builds from its config, as transformers 5 does: the one table the analytic
parameter count (core/architecture.py) and the per-family activation terms read.

Each entry is checked against the model transformers instantiates on the meta device, for every
shipped config and for tiny variants with every flag set (tests/test_families.py); a family not
listed here is counted on the meta device when torch is installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    """How one `model_type` lays out a decoder layer.

    qk_norm: "head" normalises each head (RMSNorm of head_dim: Qwen3, Gemma 3), "full" the whole
    projection (RMSNorm of heads·head_dim and kv_heads·head_dim: OLMo 2, OLMoE).
    moe: "" dense; "experts" every layer routes to experts of `expert_intermediate` width;
    "sparse_step" as Qwen-MoE, where `decoder_sparse_step` and `mlp_only_layers` keep some layers dense.
    defaults: what transformers' config class assumes for a key the config.json leaves out.
    """

    fused_projections: bool = False      # Phi-3: one qkv_proj and one gate_up_proj
    attention_bias_key: bool = False     # `attention_bias` adds biases to q, k, v and o
    mlp_bias_key: bool = False           # `mlp_bias` adds biases to gate, up and down (Llama)
    qkv_bias: bool = False               # q, k, v always biased (Qwen2); Qwen2-MoE reads `qkv_bias`
    qk_norm: str = ""
    norms_per_layer: int = 2             # Gemma 2/3: pre and post norms around attention and MLP
    fp32_norm_weight: bool = False       # Gemma 2/3, OLMo 2: the norm's weight multiplies in fp32, then casts
    moe: str = ""
    expert_width_key: str = "intermediate_size"
    shared_expert: bool = False          # Qwen2-MoE: one always-on MLP and its sigmoid gate
    defaults: dict = field(default_factory=dict)


_LLAMA_DEFAULTS = {"tie_word_embeddings": False}
FAMILIES: dict[str, Family] = {
    "llama": Family(attention_bias_key=True, mlp_bias_key=True, defaults=_LLAMA_DEFAULTS),
    "mistral": Family(defaults={"tie_word_embeddings": False}),
    "qwen2": Family(qkv_bias=True, defaults=_LLAMA_DEFAULTS),
    "qwen3": Family(attention_bias_key=True, qk_norm="head",
                    defaults={"tie_word_embeddings": False, "head_dim": 128}),
    "gemma2": Family(attention_bias_key=True, norms_per_layer=4, fp32_norm_weight=True,
                     defaults={"tie_word_embeddings": True, "head_dim": 256}),
    "gemma3_text": Family(attention_bias_key=True, qk_norm="head", norms_per_layer=4, fp32_norm_weight=True,
                          defaults={"tie_word_embeddings": True, "head_dim": 256}),
    "phi3": Family(fused_projections=True, defaults=_LLAMA_DEFAULTS),
    "olmo2": Family(attention_bias_key=True, qk_norm="full", fp32_norm_weight=True, defaults=_LLAMA_DEFAULTS),
    "mixtral": Family(moe="experts", defaults={"tie_word_embeddings": False,
                                              "num_local_experts": 8, "num_experts_per_tok": 2}),
    "olmoe": Family(attention_bias_key=True, qk_norm="full", moe="experts",
                    defaults={"tie_word_embeddings": False, "num_experts": 64, "num_experts_per_tok": 8}),
    "qwen2_moe": Family(moe="sparse_step", expert_width_key="moe_intermediate_size", shared_expert=True,
                        defaults={"tie_word_embeddings": False, "qkv_bias": True,
                                  "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                                  "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1}),
    "qwen3_moe": Family(attention_bias_key=True, qk_norm="head", moe="sparse_step",
                        expert_width_key="moe_intermediate_size",
                        defaults={"tie_word_embeddings": False,
                                  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                                  "decoder_sparse_step": 1}),
}

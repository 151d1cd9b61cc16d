"""The activation count against what autograd actually saves: every shipped family, shrunk, on the CPU.

models/activations.py counts, per decoder layer and token, the tensors autograd keeps for backward. This
builds each shipped architecture's family at a few MiB (same model class, same ratios of query to KV heads,
fused projections, norms), runs one forward pass under the Trainer's autocast with a saved-tensors hook that
sums every distinct storage kept, and prints measured against counted bytes per layer and token for full
fine-tuning with fp32 weights (Trainer's bf16=True), in pure bf16, and for LoRA on a bf16 base. One layer's
bytes per token are the difference of models with 3 and 2 layers at batch 4 and 2, so the embedding, the
loss and anything sized by the sequence alone (RoPE tables, the causal mask) drop out. The SDPA rows are
unmasked (the flash-like path SDPA takes on the CPU and on CUDA alike; the masked path is measured on the
GPU, benchmarks/gpu/mask_path.py); eager attention, which saves its seq² scores, is measured here for three
query/KV head ratios and Gemma 2, whose attention softcapping SDPA cannot run.

    python -m benchmarks.saved_tensors
"""

from __future__ import annotations

import warnings

from ftplan.core.architecture import Architecture, load_architecture
from ftplan.core.settings import Setting
from ftplan.models.activations import layer_bytes_per_token

SEQ = 48
HIDDEN, HEADS, HEAD_DIM = 256, 8, 32
# (architecture whose family is shrunk, setting fields): one row of the table each
MODES = {"full, fp32 weights": {"precision": "bf16"}, "full, bf16-pure": {"precision": "bf16-pure"},
         "LoRA r16, bf16 base": {"precision": "bf16", "lora_rank": 16}}
FAMILIES = ("llama-3-8b", "qwen2.5-0.5b", "qwen3-8b", "olmo-2-1b", "gemma-3-1b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b")
EAGER_MODE = ("full, fp32 weights, eager", {"precision": "bf16", "attention": "eager"})
EAGER_FAMILIES = ("llama-3-8b", "qwen2.5-0.5b", "gemma-3-1b", "gemma-2-2b")  # 4, 7 and 4 query heads a KV head


def shrunk(arch_id: str, layers: int) -> Architecture:
    """The architecture at hidden 256 and 8 heads of 32, its query/KV head ratio, family and flags kept."""
    arch = load_architecture(arch_id)
    ratio = arch.heads // arch.kv_heads
    config = {**arch.config, "hidden_size": HIDDEN, "num_attention_heads": HEADS, "head_dim": HEAD_DIM,
              "num_key_value_heads": max(1, HEADS // ratio), "num_hidden_layers": layers,
              "intermediate_size": round(HIDDEN * arch.intermediate / arch.hidden), "vocab_size": 512,
              "max_position_embeddings": 4 * SEQ, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config.pop("layer_types", None)
    config.pop("rope_scaling", None)
    return Architecture(f"{arch_id} (shrunk)", config)


def _model(arch: Architecture, setting: Setting):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    config._attn_implementation = setting.attention
    model = AutoModelForCausalLM.from_config(config)
    model = model.to(torch.float32 if setting.precision == "bf16" and not setting.lora_rank else torch.bfloat16)
    if setting.lora_rank:
        model = get_peft_model(model, LoraConfig(r=setting.lora_rank, lora_alpha=2 * setting.lora_rank,
                                                 target_modules="all-linear", task_type="CAUSAL_LM")).base_model.model
        model.enable_input_require_grads()
    return model


def _saved_bytes(model, batch: int) -> int:
    """Bytes of every distinct storage autograd saves in one forward pass of the decoder (no loss)."""
    import torch

    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.randint(3, 500, (batch, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model.model(input_ids=ids)
    return sum(storages.values())


def measured_layer_bytes(arch_id: str, setting: Setting) -> float:
    """One decoder layer's saved bytes per token, measured."""
    import torch

    torch.manual_seed(0)
    deep, shallow = (_model(shrunk(arch_id, layers), setting) for layers in (3, 2))
    per_batch = [_saved_bytes(deep, b) - _saved_bytes(shallow, b) for b in (4, 2)]
    return (per_batch[0] - per_batch[1]) / (2 * SEQ)


def rows() -> list[tuple[str, str, float, int]]:
    """(architecture, mode, measured, counted) bytes per layer and token."""
    cases = [(arch_id, mode, fields) for arch_id in FAMILIES for mode, fields in MODES.items()]
    cases += [(arch_id, *EAGER_MODE) for arch_id in EAGER_FAMILIES]
    table = []
    for arch_id, mode, fields in cases:
        setting = Setting(model=arch_id, seq_len=SEQ, **fields)
        table.append((arch_id, mode, measured_layer_bytes(arch_id, setting),
                      layer_bytes_per_token(shrunk(arch_id, 3), setting)))
    return table


def main() -> None:
    warnings.filterwarnings("ignore")
    print(f"{'family of':16} {'mode':22} {'measured':>9} {'counted':>8} {'error':>7}   (bytes per layer and token)")
    for arch_id, mode, measured, counted in rows():
        print(f"{arch_id:16} {mode:22} {measured:9.0f} {counted:8d} {counted / measured - 1:+7.1%}")


if __name__ == "__main__":
    main()

"""The DeepSpeed config for a setting: one definition used by calibration trials and by `plan --emit`.

"auto" values are filled in by the Hugging Face Trainer from TrainingArguments, so the same JSON runs
as-is under any batch size the user picks. No optimizer section: the Trainer's AdamW is used, and
with CPU offload DeepSpeed swaps in its CPU Adam (zero_force_ds_cpu_optimizer).
"""

from __future__ import annotations

from ftplan.core.settings import Setting


def deepspeed_config(setting: Setting) -> dict | None:
    """ZeRO config for the setting, or None when the setting trains without DeepSpeed."""
    if not setting.uses_deepspeed:
        return None
    zero: dict = {
        "stage": setting.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    if setting.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if setting.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    precision = {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    return {
        **precision,
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }

"""Turn the recommended setup into files that run as-is with the Hugging Face Trainer and DeepSpeed.

The DeepSpeed JSON starts from calibration's own definition (calibration/deepspeed_config.py), so
the emitted run is configured like the runs the prediction came from; the batch is written out
explicitly so the file says what was planned, and the Trainer checks it against its arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

from ftplan.calibration.deepspeed_config import deepspeed_config
from ftplan.core.errors import FtplanError
from ftplan.core.settings import Setting
from ftplan.planner.eta import format_duration
from ftplan.planner.search import PlanRequest, SetupPlan

DS_CONFIG = "ds_config.json"
TRAINING_ARGS = "training_args.json"
README = "README.txt"


def ds_config(setting: Setting, micro_batch: int) -> dict | None:
    """DeepSpeed config with the planned micro-batch; None when the setup runs without DeepSpeed."""
    config = deepspeed_config(setting)
    if config is None:
        return None
    precision = {"bf16": {"enabled": setting.precision == "bf16"}, "fp16": {"enabled": setting.precision == "fp16"}}
    return {**config, **precision, "train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": 1}


def training_args(setting: Setting, micro_batch: int, epochs: float, output_dir: str,
                  ds_config_path: str | None) -> dict:
    """Keyword arguments for transformers.TrainingArguments, matching the calibrated setup."""
    args = {
        "output_dir": output_dir,
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": 1,
        "num_train_epochs": epochs,
        "optim": setting.optimizer,
        "bf16": setting.precision in ("bf16", "bf16-pure"),
        "fp16": setting.precision == "fp16",
        "gradient_checkpointing": setting.gradient_checkpointing,
        "use_liger_kernel": setting.liger,
    }
    if setting.gradient_checkpointing:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if ds_config_path is not None:
        args["deepspeed"] = ds_config_path
    return args


def readme(setup: SetupPlan, request: PlanRequest) -> str:
    """How to use the files, and the Liger / LoRA lines the Trainer arguments cannot carry."""
    setting = setup.setting
    if setting.nodes > 1:
        launch = (f"torchrun --nnodes {setting.nodes} --nproc_per_node {setting.gpus} --rdzv-backend c10d "
                  "--rdzv-endpoint HOST:29500 train.py  (on every node; HOST is the first node)")
    elif setting.uses_deepspeed:
        launch = f"deepspeed --num_gpus {setting.gpus} train.py"
    else:
        launch = f"torchrun --nproc_per_node {setting.gpus} train.py"
    lines = [
        f"ftplan plan: {setup.label} for {setting.model} on {setting.world_size} x {request.gpu.name}",
        f"micro-batch {setup.batch} per GPU, {setup.eta.steps:,} steps x {setup.eta.seconds_per_step:.2f} s = "
        f"{format_duration(setup.eta.total_seconds)} (h:mm), predicted source: {setup.best.source}",
        "",
        "Load the arguments and train:",
        "    args = TrainingArguments(**json.load(open('training_args.json')))",
        f"    launch with: {launch}",
    ]
    if setting.liger:
        lines += ["", "Liger: training_args.json sets use_liger_kernel=True; outside the Trainer patch the model first:",
                  "    from liger_kernel.transformers import AutoLigerKernelForCausalLM",
                  "    model = AutoLigerKernelForCausalLM.from_pretrained(MODEL)"]
    if setting.lora_rank:
        targets = ", ".join(repr(t) for t in setting.lora_targets)
        lines += ["", "LoRA (PEFT) on the model before building the Trainer:",
                  "    from peft import LoraConfig, get_peft_model",
                  f"    model = get_peft_model(model, LoraConfig(r={setting.lora_rank}, lora_alpha={2 * setting.lora_rank}, "
                  f"target_modules=[{targets}], task_type='CAUSAL_LM'))"]
        if setting.gradient_checkpointing:
            lines.append("    model.enable_input_require_grads()  # checkpointing with a frozen base")
    return "\n".join(lines) + "\n"


def write_configs(directory: Path, setup: SetupPlan, request: PlanRequest) -> list[Path]:
    """Write training_args.json, ds_config.json (DeepSpeed setups only) and README.txt; return their paths."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        ds = ds_config(setup.setting, setup.batch)
        ds_path = None
        if ds is not None:
            ds_path = directory / DS_CONFIG
            ds_path.write_text(json.dumps(ds, indent=2) + "\n")
            written.append(ds_path)
        args = training_args(setup.setting, setup.batch, request.epochs, str(directory / "output"),
                             str(ds_path.resolve()) if ds_path else None)
        args_path = directory / TRAINING_ARGS
        args_path.write_text(json.dumps(args, indent=2) + "\n")
        readme_path = directory / README
        readme_path.write_text(readme(setup, request))
    except OSError as exc:
        raise FtplanError(f"cannot write configs to {directory}: {exc.strerror}") from None
    return [*written, args_path, readme_path]

"""Parameter counts of a model as transformers builds it, on the meta device (no memory, no weights).

The ground truth the analytic family table is tested against, and the count for a family ftplan has
no table entry for. Needs torch and transformers, imported only when called.
"""

from __future__ import annotations

import re

from ftplan.core.structure import MODULE_CLASSES, Linear, ParamCounts, Structure
from ftplan.core.errors import FtplanError

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


def meta_structure(config: dict) -> Structure:
    """Instantiate the config's causal LM on the meta device and count what it holds."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        raise FtplanError(f"model_type {config.get('model_type')!r} has no analytic parameter count; "
                          f"counting it on the meta device needs torch and transformers ({exc.name} is missing)") from None
    try:
        hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if not k.startswith("_")})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception as exc:  # noqa: BLE001 - each model class validates its config its own way (AttributeError
        # from Falcon's head_dim, huggingface_hub's StrictDataclassClassValidationError from DBRX and Zamba2)
        raise FtplanError(f"transformers cannot build a causal LM of model_type {config.get('model_type')!r}: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    structure = structure_of(model)
    if not structure.linears:  # BERT's encoder.layer.N, GPT-2's Conv1D h.N: no decoder ftplan can count or adapt
        raise FtplanError(f"model_type {config.get('model_type')!r} has no decoder layers of linear projections "
                          "(model.layers.N.*_proj) that ftplan counts and LoRA adapts; it plans decoder-only LLMs")
    return structure


def structure_of(model) -> Structure:
    """Parameters by module class (named_parameters lists a tied lm_head once, as the embedding) and
    every nn.Linear inside the decoder layers."""
    import torch

    counts = dict.fromkeys(MODULE_CLASSES, 0)
    for name, parameter in model.named_parameters():
        counts[module_class(name)] += parameter.numel()
    linears = []
    for name, module in model.named_modules():
        match = _LAYER.search(name)
        if match and isinstance(module, torch.nn.Linear):
            linears.append(Linear(int(match.group(1)), match.group(2).rsplit(".", 1)[-1],
                                  module.in_features, module.out_features))
    return Structure(ParamCounts(**counts), tuple(linears), "meta device")


def module_class(parameter_name: str) -> str:
    """Which class of MODULE_CLASSES a parameter belongs to, from its name."""
    module = parameter_name.rsplit(".", 1)[0] if parameter_name.endswith((".weight", ".bias")) else parameter_name
    last = module.rsplit(".", 1)[-1]
    if parameter_name.startswith("lm_head"):
        return "lm_head"
    if "embed_tokens" in module:
        return "embeddings"
    if "norm" in last:
        return "norms"
    if ".experts." in f"{module}.":
        return "experts"
    if module.endswith(("mlp.gate", "shared_expert_gate", ".router")):
        return "router"
    if ".self_attn." in f"{module}.":
        return "attention"
    return "mlp"

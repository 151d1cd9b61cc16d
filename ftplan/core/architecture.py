"""Model architectures from config JSON, with exact parameter counts computed without torch.

The counts must equal what transformers builds from the same config (tests check this), because
every memory estimate starts from them.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.families import FAMILIES, Family
from ftplan.core.paths import architectures_dir
from ftplan.core.structure import Linear, ParamCounts, Structure

MAX_CONFIG_BYTES = 16 * 2**20
ALL_LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "num_experts", "num_local_experts", "num_experts_per_tok",
                   "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
                   "max_position_embeddings")
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias")
LARGEST_SIZE = 2**24  # 16M: 100x the largest vocabulary or hidden size of any released model; above it, a typo
EXPERTS_TARGET = "experts"  # LoRA target name for the router and fused experts (PEFT's target_parameters)
_PEFT_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")  # names PEFT also maps onto an MoE's fused experts


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer described by its Hugging Face config."""

    id: str
    config: dict

    @property
    def caveats(self) -> list[str]:
        """What the config says that ftplan plans as something else (config_caveats), each naming the model."""
        return [f"{self.id}: {caveat}" for caveat in config_caveats(self.config)]

    def get(self, key: str):
        """A config value, else what the family's config class assumes when config.json leaves it out."""
        value = self.config.get(key)
        return value if value is not None else (self.family.defaults.get(key) if self.family else None)

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def family(self) -> Family | None:
        return FAMILIES.get(self.model_type)

    @property
    def hidden(self) -> int:
        return self.config["hidden_size"]

    @property
    def intermediate(self) -> int:
        return self.config["intermediate_size"]

    @property
    def layers(self) -> int:
        return self.config["num_hidden_layers"]

    @property
    def heads(self) -> int:
        return self.config["num_attention_heads"]

    @property
    def kv_heads(self) -> int:
        return self.get("num_key_value_heads") or self.heads

    @property
    def head_dim(self) -> int:
        return self.get("head_dim") or self.hidden // self.heads

    @property
    def vocab(self) -> int:
        return self.config["vocab_size"]

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.get("tie_word_embeddings"))

    @property
    def qkv_bias(self) -> bool:
        """Biases on q, k and v: always in Qwen2, by `qkv_bias` in Qwen2-MoE, by attention_bias elsewhere."""
        family = self.family or Family()
        return family.qkv_bias or bool(self.get("qkv_bias")) or (family.attention_bias_key and bool(self.get("attention_bias")))

    @property
    def experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model); all of them are held in memory."""
        if not (self.family and self.family.moe):
            return 0
        return self.get("num_local_experts") or self.get("num_experts") or 0

    @property
    def experts_per_token(self) -> int:
        """Experts each token is routed to (top-k): what activations and FLOPs scale with."""
        return self.get("num_experts_per_tok") or 0 if self.experts else 0

    @property
    def expert_intermediate(self) -> int:
        return self.get(self.family.expert_width_key) if self.experts else 0

    @property
    def shared_expert_intermediate(self) -> int:
        return self.get("shared_expert_intermediate_size") if self.experts and self.family.shared_expert else 0

    def is_moe_layer(self, layer: int) -> bool:
        """Qwen-MoE keeps a layer dense when it is in mlp_only_layers or off the decoder_sparse_step grid."""
        if not self.experts:
            return False
        if self.family.moe == "sparse_step":
            step = self.get("decoder_sparse_step") or 1
            return layer not in (self.config.get("mlp_only_layers") or []) and (layer + 1) % step == 0
        return True

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def sliding_window(self) -> int | None:
        """Tokens a sliding-window layer attends to, if any layer slides (Gemma 2/3, Mistral, Phi-3)."""
        window = self.config.get("sliding_window")
        return window if isinstance(window, int) and window > 0 and self.config.get("use_sliding_window", True) else None

    @property
    def final_logit_softcapping(self) -> float | None:
        return self.config.get("final_logit_softcapping")

    @property
    def attention_softcapping(self) -> float | None:
        """Gemma 2's tanh cap on the attention scores: SDPA cannot apply it, so transformers 5.2x refuses
        attn_implementation="sdpa" for such a model (Gemma2PreTrainedModel._supports_sdpa is False)."""
        return self.config.get("attn_logit_softcapping")

    @property
    def default_attention(self) -> str:
        """The attention implementation a run loads unless told otherwise: SDPA, or eager where SDPA cannot
        compute the model's attention."""
        return "eager" if self.attention_softcapping else "sdpa"

    def check_attention(self, attention: str) -> None:
        """Refuse an implementation that cannot compute this model's attention, in one line."""
        if attention == "sdpa" and self.attention_softcapping:
            raise FtplanError(f"{self.id}: attention 'sdpa' cannot apply its attention softcapping "
                              f"(attn_logit_softcapping {self.attention_softcapping}); transformers refuses it, "
                              "older versions silently dropped the cap: use eager or flash_attention_2")

    @cached_property
    def shape(self) -> tuple:
        """What decides memory and time. Two configs of one shape are one architecture for every fit:
        the full-config hash never matches across tools (transformers adds and renames keys), and a
        config path typed differently, or the copy the Trainer callback writes, is the same model.
        Families beyond Llama, Qwen2 and Mistral add their own fields, so the first three keep their keys."""
        fields = tuple(getattr(self, name) for name in ("model_type", "hidden", "intermediate", "layers", "heads",
                                                          "kv_heads", "head_dim", "vocab", "tied_embeddings", "qkv_bias"))
        fields += tuple(bool(self.config.get(k)) for k in ("attention_bias", "mlp_bias"))
        if self.model_type in ("llama", "qwen2", "mistral"):
            return fields
        return fields + (self.experts, self.experts_per_token, self.expert_intermediate, self.moe_layers,
                         self.shared_expert_intermediate, self.sliding_window, self.final_logit_softcapping)

    @cached_property
    def hash(self) -> str:
        """Short digest of the config, so records of a changed architecture are never mixed."""
        canonical = json.dumps({k: v for k, v in self.config.items() if not k.startswith("_")}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    @cached_property
    def structure(self) -> Structure:
        """Counted from the family table without torch; a family ftplan does not know is instantiated on
        the meta device (needs torch and transformers)."""
        if self.family is None:
            from ftplan.core.meta_count import meta_structure

            return meta_structure(self.config)
        return analytic_structure(self)

    @property
    def param_counts(self) -> ParamCounts:
        return self.structure.counts

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params_total(self) -> int:
        return self.param_counts.total

    @property
    def decoder_params(self) -> int:
        """Parameters of all decoder layers (everything but embeddings, lm_head and the final norm)."""
        counts = self.param_counts
        return counts.total - counts.embeddings - counts.lm_head - self.hidden

    def params_per_layer(self) -> int:
        """Parameters of an average decoder layer (layers differ in Qwen-MoE)."""
        return -(-self.decoder_params // self.layers)

    @property
    def active_decoder_params(self) -> float:
        """Decoder parameters one token passes through: of the experts only its top-k (FLOPs scale with these)."""
        experts = self.param_counts.experts
        return self.decoder_params - experts + (experts * self.experts_per_token / self.experts if self.experts else 0)

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer by module name, the widest where layers differ."""
        shapes: dict[str, tuple[int, int]] = {}
        for linear in self.structure.linears:
            if linear.in_features * linear.out_features > math.prod(shapes.get(linear.name, (0, 0))):
                shapes[linear.name] = (linear.in_features, linear.out_features)
        return shapes

    @property
    def largest_tensor_params(self) -> int:
        """Elements of the largest single parameter: the embedding, one linear, or one layer's fused experts."""
        experts = (self.experts * 2 * self.expert_intermediate * self.hidden) if self.experts else 0
        return max(self.embedding_params, experts, *(i * o for i, o in self.linear_shapes().values()))

    @property
    def linear_weight_params(self) -> int:
        """Weights of the decoder layers' nn.Linear modules: what bitsandbytes quantizes to 4 bits."""
        return sum(linear.in_features * linear.out_features for linear in self.structure.linears)

    def all_linear_targets(self) -> tuple[str, ...]:
        """Module names PEFT's `target_modules="all-linear"` adapts: every Linear but the output layer, and on
        an MoE the router and fused experts too (EXPERTS_TARGET; PEFT >= 0.22 converts them to target_parameters)."""
        names = tuple(dict.fromkeys(linear.name for linear in self.structure.linears))
        return names + (EXPERTS_TARGET,) if self.experts else names

    def resolve_lora_targets(self, targets: tuple[str, ...]) -> tuple[str, ...]:
        """The module names LoRA adapts: the default (Llama's seven projections) means all-linear, so on
        Phi-3 it names the fused qkv_proj and gate_up_proj, and on Qwen2-MoE the shared expert too."""
        if set(targets) == set(ALL_LINEAR_TARGETS):
            return self.all_linear_targets()
        if set(targets) == set(self.all_linear_targets()):  # all-linear as PEFT expands it (a live run's config)
            return self.all_linear_targets()
        if self.experts and set(targets) & {EXPERTS_TARGET, *_PEFT_EXPERT_NAMES}:
            raise FtplanError(f"on {self.id} PEFT maps {'/'.join(_PEFT_EXPERT_NAMES)} onto the fused experts too; "
                              "adapt them as part of all-linear (the default targets) or leave them out")
        unknown = set(targets) - set(self.all_linear_targets())
        if unknown:
            raise FtplanError(f"unknown LoRA target module(s) {sorted(unknown)} for {self.id}; "
                              f"choose from {list(self.all_linear_targets())}")
        return tuple(targets)

    def lora_params(self, rank: int, targets: tuple[str, ...] = ALL_LINEAR_TARGETS) -> int:
        """Trainable parameters of LoRA adapters (A: in×r, B: r×out) on the named modules of every layer."""
        if rank > self.hidden:  # the adapter would outgrow the weight it adapts: a typo, not a setting
            raise FtplanError(f"LoRA rank {rank} is above {self.id}'s hidden size {self.hidden}; "
                              f"use a rank up to {self.hidden}")
        names = set(self.resolve_lora_targets(targets))
        linears = sum(rank * (lin.in_features + lin.out_features) for lin in self.structure.linears if lin.name in names)
        return linears + (self.moe_layers * self.expert_lora_params_per_layer(rank) if EXPERTS_TARGET in names else 0)

    def expert_lora_params_per_layer(self, rank: int) -> int:
        """PEFT's adapters on one MoE layer's router (E×h) and fused experts: A and B of rank·E rows per
        expert stack, gate_up at twice the rank (it fuses two projections)."""
        e, h, width = self.experts, self.hidden, self.expert_intermediate
        return rank * (h + e) + 2 * rank * e * (h + 2 * width) + rank * e * (width + h)

    def trainable_params(self, lora_rank: int, targets: tuple[str, ...] = ALL_LINEAR_TARGETS) -> int:
        return self.lora_params(lora_rank, targets) if lora_rank > 0 else self.params_total


def analytic_structure(arch: Architecture) -> Structure:
    """Parameters by class and the linear modules, from the family table alone (no torch)."""
    family, h = arch.family, arch.hidden
    q_out, kv_out = arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    linears: list[Linear] = []
    attention = mlp = experts = router = norms = 0
    attention_bias = family.attention_bias_key and bool(arch.get("attention_bias"))
    mlp_bias = family.mlp_bias_key and bool(arch.get("mlp_bias"))

    def add(layer: int, name: str, fan_in: int, fan_out: int, bias: bool) -> int:
        linears.append(Linear(layer, name, fan_in, fan_out))
        return fan_in * fan_out + (fan_out if bias else 0)

    def dense_mlp(layer: int, width: int) -> int:
        if family.fused_projections:
            return add(layer, "gate_up_proj", h, 2 * width, mlp_bias) + add(layer, "down_proj", width, h, mlp_bias)
        return (add(layer, "gate_proj", h, width, mlp_bias) + add(layer, "up_proj", h, width, mlp_bias)
                + add(layer, "down_proj", width, h, mlp_bias))

    for layer in range(arch.layers):
        if family.fused_projections:  # Phi-3 registers o_proj first
            attention += add(layer, "o_proj", q_out, h, attention_bias) + add(layer, "qkv_proj", h, q_out + 2 * kv_out, False)
        else:
            attention += (add(layer, "q_proj", h, q_out, arch.qkv_bias) + add(layer, "k_proj", h, kv_out, arch.qkv_bias)
                          + add(layer, "v_proj", h, kv_out, arch.qkv_bias) + add(layer, "o_proj", q_out, h, attention_bias))
        norms += family.norms_per_layer * h
        norms += {"head": 2 * arch.head_dim, "full": q_out + kv_out}.get(family.qk_norm, 0)
        if not arch.is_moe_layer(layer):
            mlp += dense_mlp(layer, arch.intermediate)
            continue
        experts += arch.experts * 3 * arch.expert_intermediate * h  # fused gate_up (E, 2I, h) and down (E, h, I)
        router += arch.experts * h
        if family.shared_expert:
            mlp += dense_mlp(layer, arch.shared_expert_intermediate)
            router += add(layer, "shared_expert_gate", h, 1, False)
    embeddings = arch.vocab * h
    counts = ParamCounts(embeddings=embeddings, attention=attention, mlp=mlp, experts=experts, router=router,
                         norms=norms + h, lm_head=0 if arch.tied_embeddings else embeddings)
    return Structure(counts, tuple(linears), "analytic")


def available_architectures() -> list[str]:
    return sorted(p.stem for p in architectures_dir().glob("*.json"))


def load_architecture(name_or_path: str) -> Architecture:
    """A shipped architecture by id (e.g. 'llama-3-8b'), a Hugging Face config.json by path, or a local
    model folder holding one; the config is checked here, so a bad one fails in one line, not in a fit."""
    path, arch_id = _config_path(name_or_path)
    if path.stat().st_size > MAX_CONFIG_BYTES:  # a config is a few kB; a 1 GB one was read whole
        raise FtplanError(f"model config {path} is over {MAX_CONFIG_BYTES // 2**20} MiB: not a config.json")
    try:
        config = json.loads(path.read_bytes())
    except RecursionError:
        raise FtplanError(f"cannot read model config {path}: JSON nested too deeply") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8, or a number too long
        raise FtplanError(f"cannot read model config {path}: {exc}") from None
    problem = config_problem(config)
    if problem:
        raise FtplanError(f"{path}: {problem}")
    return Architecture(id=arch_id, config=config)


def config_caveats(config: dict) -> list[str]:
    """What a config says that ftplan plans as something else: a head other than a causal LM's, or weights
    quantized by another method than QLoRA's bitsandbytes (planned as the bf16 weights they came from)."""
    caveats = []
    named = config.get("architectures")
    named = [named] if isinstance(named, str) else named if isinstance(named, list) else []
    heads = [a for a in named if isinstance(a, str) and not a.endswith("ForCausalLM")]
    if heads:
        caveats.append(f"architectures {', '.join(heads)}: planned as a causal language model (its head and loss "
                       "differ)")
    quantization = config.get("quantization_config")
    method = quantization.get("quant_method") if isinstance(quantization, dict) else None
    if quantization is not None and method != "bitsandbytes":
        caveats.append(f"pre-quantized weights ({method or 'quantization_config'}): planned as bf16 weights; ftplan "
                       "models a 4-bit base as QLoRA's bitsandbytes NF4 only (--allow qlora)")
    return caveats


def _config_path(name_or_path: str) -> tuple[Path, str]:
    """(config file, architecture id); anything that looks like a path is reported as a path, not as an unknown model."""
    path = Path(name_or_path)
    shipped = architectures_dir() / f"{name_or_path}.json"
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FtplanError(f"{path} is a folder without a config.json (a local Hugging Face model folder holds one)")
        return path / "config.json", path.resolve().name
    if path.suffix == ".json" or "/" in name_or_path or os.sep in name_or_path:
        if not path.is_file():
            hub = "" if path.suffix == ".json" or path.exists() or name_or_path.count("/") != 1 else (
                f"; '{name_or_path}' looks like a Hugging Face Hub id: ftplan cannot download, "
                f"so pass a local config.json or the model folder holding it{_shipped_hint(path.name)}")
            raise FtplanError(f"model config {path} does not exist{hub}")
        return path, path.parent.resolve().name if path.name == "config.json" else path.stem
    if not shipped.is_file():
        known = available_architectures()
        close = difflib.get_close_matches(name_or_path, known, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
        raise FtplanError(f"unknown model '{name_or_path}'{hint} (or pass a path to a config.json or a model folder)")
    return shipped, name_or_path


def _shipped_hint(repo_name: str) -> str:
    """The shipped architecture a Hub repository's name points at (meta-llama/Llama-3.2-1B: llama-3.2-1b)."""
    close = difflib.get_close_matches(repo_name.lower(), available_architectures(), n=1, cutoff=0.8)
    return f", or the shipped '{close[0]}'" if close else ""


def config_problem(config: object) -> str | None:
    """Why a config cannot describe a model ftplan can count, or None.

    Every size is divided by or multiplied into memory estimates: a zero head count was a
    ZeroDivisionError, a size given as text a TypeError, a negative one a negative GiB.
    """
    if not isinstance(config, dict):
        return "is not a JSON object"
    missing = [k for k in ("model_type", *_SIZES) if k not in config]
    if missing and isinstance(config.get("text_config"), dict):
        return ("is a multimodal model's config (its language model's sizes are in text_config): ftplan plans "
                "decoder-only language models; save text_config as a config.json of its own to plan the language "
                "model alone, without the vision tower's memory")
    if missing:
        return f"is not a decoder-only model config: missing {', '.join(missing)}"
    if not isinstance(config["model_type"], str):
        return f"model_type {config['model_type']!r} not supported (it must be text naming a transformers model type)"
    if config["model_type"] not in FAMILIES and not meta_counting_available():
        return (f"model_type {config['model_type']!r} has no analytic parameter count (known: {', '.join(FAMILIES)}); "
                f"install torch and transformers to count it on the meta device")
    for key in (*_SIZES, *_OPTIONAL_SIZES):
        value = config.get(key)
        if (key in _SIZES or value is not None) and not _is_size(value):
            return f"{key} must be a positive integer up to {LARGEST_SIZE}, got {value!r}"
    for key in _FLAGS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            return f"{key} must be true or false, got {config[key]!r}"
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if heads % kv_heads:
        return f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
    if not config.get("head_dim") and config["hidden_size"] % heads:
        return f"hidden_size {config['hidden_size']} is not a multiple of num_attention_heads {heads} (and no head_dim)"
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts and (config.get("num_experts_per_tok") or 0) > experts:
        return f"num_experts_per_tok {config['num_experts_per_tok']} is more than the {experts} experts"
    return None


def meta_counting_available() -> bool:
    """Whether torch and transformers are installed, so an unknown family can be counted on the meta device."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= LARGEST_SIZE


def run_attention(model: str, attention: str | None) -> str:
    """The attention implementation a run of `model` loads: the one asked for, checked, or the model's default."""
    arch = cached_architecture(model)
    chosen = attention or arch.default_attention
    arch.check_attention(chosen)
    return chosen


@lru_cache(maxsize=64)
def cached_architecture(name_or_path: str) -> Architecture:
    """load_architecture for hot loops (fits, prior, planner search); a config edited on disk mid-process is not re-read."""
    return load_architecture(name_or_path)

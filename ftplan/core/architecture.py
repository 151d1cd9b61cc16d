"""Model architectures from config JSON, with exact parameter counts computed without torch.

The counts must equal what transformers builds from the same config (tests check this), because
every memory estimate starts from them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.paths import architectures_dir

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
MAX_CONFIG_BYTES = 16 * 2**20
ALL_LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim")
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias")
LARGEST_SIZE = 2**24  # 16M: 100x the largest vocabulary or hidden size of any released model; above it, a typo


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer described by its Hugging Face config."""

    id: str
    config: dict

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

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
        return self.config.get("num_key_value_heads") or self.heads

    @property
    def head_dim(self) -> int:
        return self.config.get("head_dim") or self.hidden // self.heads

    @property
    def vocab(self) -> int:
        return self.config["vocab_size"]

    @property
    def tied_embeddings(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    @property
    def qkv_bias(self) -> bool:
        """Qwen2 has biases on q, k and v; Llama only when attention_bias is set."""
        return self.model_type == "qwen2" or bool(self.config.get("attention_bias", False))

    @cached_property
    def shape(self) -> tuple:
        """What decides memory and time. Two configs of one shape are one architecture for every fit:
        the full-config hash never matches across tools (transformers adds and renames keys), and a
        config path typed differently, or the copy the Trainer callback writes, is the same model."""
        fields = tuple(getattr(self, name) for name in ("model_type", "hidden", "intermediate", "layers", "heads",
                                                          "kv_heads", "head_dim", "vocab", "tied_embeddings", "qkv_bias"))
        return fields + tuple(bool(self.config.get(k)) for k in ("attention_bias", "mlp_bias"))

    @cached_property
    def hash(self) -> str:
        """Short digest of the config, so records of a changed architecture are never mixed."""
        canonical = json.dumps({k: v for k, v in self.config.items() if not k.startswith("_")}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer in one decoder block, by module name."""
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q_out),
            "k_proj": (self.hidden, kv_out),
            "v_proj": (self.hidden, kv_out),
            "o_proj": (q_out, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def params_per_layer(self) -> int:
        shapes = self.linear_shapes()
        weights = sum(i * o for i, o in shapes.values())
        bias = (shapes["q_proj"][1] + 2 * shapes["k_proj"][1]) if self.qkv_bias else 0
        bias += self.hidden if self.config.get("attention_bias") else 0  # o_proj bias in Llama
        if self.config.get("mlp_bias"):
            bias += 2 * self.intermediate + self.hidden
        norms = 2 * self.hidden
        return weights + bias + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params_total(self) -> int:
        lm_head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.embedding_params + self.layers * self.params_per_layer() + self.hidden + lm_head

    def lora_params(self, rank: int, targets: tuple[str, ...] = ALL_LINEAR_TARGETS) -> int:
        """Trainable parameters of LoRA adapters (A: in×r, B: r×out) on the named modules of every layer."""
        if rank > self.hidden:  # the adapter would outgrow the weight it adapts: a typo, not a setting
            raise FtplanError(f"LoRA rank {rank} is above {self.id}'s hidden size {self.hidden}; "
                              f"use a rank up to {self.hidden}")
        shapes = self.linear_shapes()
        unknown = set(targets) - set(shapes)
        if unknown:
            raise FtplanError(f"unknown LoRA target module(s) {sorted(unknown)}; choose from {list(shapes)}")
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)

    def trainable_params(self, lora_rank: int, targets: tuple[str, ...] = ALL_LINEAR_TARGETS) -> int:
        return self.lora_params(lora_rank, targets) if lora_rank > 0 else self.params_total


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
            hub = "" if path.suffix or path.exists() or name_or_path.count("/") != 1 else (
                f"; '{name_or_path}' looks like a Hugging Face Hub id: ftplan cannot download, "
                "so pass a local config.json or the model folder holding it")
            raise FtplanError(f"model config {path} does not exist{hub}")
        return path, path.parent.resolve().name if path.name == "config.json" else path.stem
    if not shipped.is_file():
        known = available_architectures()
        close = difflib.get_close_matches(name_or_path, known, n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
        raise FtplanError(f"unknown model '{name_or_path}'{hint} (or pass a path to a config.json or a model folder)")
    return shipped, name_or_path


def config_problem(config: object) -> str | None:
    """Why a config cannot describe a model ftplan can count, or None.

    Every size is divided by or multiplied into memory estimates: a zero head count was a
    ZeroDivisionError, a size given as text a TypeError, a negative one a negative GiB.
    """
    if not isinstance(config, dict):
        return "is not a JSON object"
    missing = [k for k in ("model_type", *_SIZES) if k not in config]
    if missing:
        return f"is not a decoder-only model config: missing {', '.join(missing)}"
    if not isinstance(config["model_type"], str) or config["model_type"] not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config['model_type']!r} not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
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
    return None


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= LARGEST_SIZE


@lru_cache(maxsize=64)
def cached_architecture(name_or_path: str) -> Architecture:
    """load_architecture for hot loops (fits, prior, planner search); a config edited on disk mid-process is not re-read."""
    return load_architecture(name_or_path)

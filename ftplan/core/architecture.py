"""Model architectures from config JSON, with exact parameter counts computed without torch.

The counts must equal what transformers builds from the same config (tests check this), because
every memory estimate starts from them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from ftplan.core.errors import FtplanError
from ftplan.core.paths import architectures_dir

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
ALL_LINEAR_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    """A shipped architecture by id (e.g. 'llama-3-8b'), or any Hugging Face config.json by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        arch_id = path.parent.name if path.name == "config.json" else path.stem
    else:
        path = architectures_dir() / f"{name_or_path}.json"
        if not path.exists():
            known = available_architectures()
            close = difflib.get_close_matches(name_or_path, known, n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(known)}"
            raise FtplanError(f"unknown model '{name_or_path}'{hint} (or pass a path to a config.json)")
        arch_id = name_or_path
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FtplanError(f"cannot read model config {path}: {exc}") from None
    missing = [k for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "vocab_size") if k not in config]
    if missing:
        raise FtplanError(f"{path} is not a decoder-only model config: missing {', '.join(missing)}")
    if config["model_type"] not in SUPPORTED_MODEL_TYPES:
        raise FtplanError(f"{path}: model_type '{config['model_type']}' not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return Architecture(id=arch_id, config=config)


@lru_cache(maxsize=64)
def cached_architecture(name_or_path: str) -> Architecture:
    """load_architecture for hot loops (fits, prior, planner search); a config edited on disk mid-process is not re-read."""
    return load_architecture(name_or_path)

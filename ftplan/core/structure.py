"""What a model instantiates, by module class: the shape both parameter counts (analytic and meta device) fill."""

from __future__ import annotations

from dataclasses import dataclass

MODULE_CLASSES = ("embeddings", "attention", "mlp", "experts", "router", "norms", "lm_head")


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by module class; q/k norms count as norms, Qwen2-MoE's shared expert as MLP and its
    gate as router; a tied lm_head is 0 (it is the embedding)."""

    embeddings: int
    attention: int
    mlp: int
    experts: int
    router: int
    norms: int
    lm_head: int

    @property
    def total(self) -> int:
        return sum(getattr(self, name) for name in MODULE_CLASSES)


@dataclass(frozen=True)
class Linear:
    """One nn.Linear inside decoder layer `layer`: what LoRA can adapt (PEFT's all-linear takes them all)."""

    layer: int
    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class Structure:
    """What a model instantiates: parameters by class and its decoder layers' linear modules."""

    counts: ParamCounts
    linears: tuple[Linear, ...]
    source: str  # "analytic" or "meta device"

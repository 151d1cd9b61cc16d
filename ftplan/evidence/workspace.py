"""One card's workspace: the records, the catalog, the links and the fitted predictor, loaded once.

`ftplan predict`, `ftplan eta`, `ftplan plan`, the Python API and the Trainer callback each began with the same
six steps (read the catalog, find the card, read the records, price the links, add the step-time spread, fit);
they open a Workspace instead, so they cannot drift apart in defaults, in the order of precedence or in which
records enter a fit (rehearsals never do).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ftplan.core.hardware import GpuSpec, find_gpu, load_catalog
from ftplan.core.settings import Setting
from ftplan.models.communication.links import Links
from ftplan.models.prediction import Prediction
from ftplan.models.safe_batch import MemoryBudget
from ftplan.models.scaling import with_step_time_cv
from ftplan.evidence.inputs import Evidence, LinkWords, load_evidence
from ftplan.store.records import same_device_kind


@dataclass(frozen=True)
class Workspace:
    """What a prediction or plan on one card rests on; `links_text` says where every link figure came from."""

    evidence: Evidence
    card: GpuSpec
    links: Links
    link_words: LinkWords
    spread_text: str

    @classmethod
    def open(cls, gpu: str, calibrations: Sequence[Path | str] = (), gpu_specs: Path | str | None = None,
             intra_node_bandwidth: str | None = None, inter_node_bandwidth: str | None = None,
             step_time_cv: float | None = None) -> Workspace:
        """Read the catalog (the user's cards also name those their records were measured on), the records
        and the links, in the precedence Evidence.links states."""
        catalog = load_catalog(Path(gpu_specs) if gpu_specs else None)
        card = find_gpu(gpu, catalog)
        evidence = load_evidence(tuple(Path(c) for c in calibrations), catalog)
        links, words = evidence.links(card, intra_node_bandwidth, inter_node_bandwidth)
        same_kind = [r for r in evidence.records if same_device_kind(r, card.name)]  # a busy CPU's steps: not GPU ranks'
        links, spread_text = with_step_time_cv(links, step_time_cv, same_kind)
        return cls(evidence, card, links, words, spread_text)

    def links_text(self, nodes: int | None = None) -> str:
        """The links and the step-time spread, in words; on exactly one node, without the link between nodes."""
        return f"{self.link_words.sentence(nodes)} {self.spread_text}"

    @cached_property
    def predictor(self):
        """The fitted predictor (from the content-keyed cache) pricing communication over these links."""
        return self.evidence.predictor_with(self.links)

    def predict(self, setting: Setting, batch: int) -> Prediction:
        return self.predictor.predict(setting, batch, self.card)

    def budget(self, safety_margin: float | None = None, context_reserve_gib: float = 0.0) -> MemoryBudget:
        return self.evidence.budget(self.card, safety_margin, context_reserve_gib)

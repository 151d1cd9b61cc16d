"""The Predictor: one answer per (setting, micro-batch, GPU), from the most trustworthy evidence there is.

In decreasing order of trust:
1. a fit of this exact setting on this GPU (calibrated inside its batch range, else extrapolated);
2. a fit of this setting on another GPU: memory from the same framework stays, time is scaled by
   bf16 throughput (compute) and memory bandwidth (optimizer step);
3. a fit of a relative (the same setting on one GPU, or at another calibrated sequence length), plus
   the prior's change between the relative and this setting (e.g. ZeRO partitioning over more GPUs);
4. the analytic prior, its constants learned from this model's records, else from all records,
   else documented defaults.
For world_size > 1 the communication model adds the gradient traffic to one GPU's compute time,
unless the fit itself is of a multi-GPU calibration.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from functools import cached_property

from ftplan.core.architecture import cached_architecture
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import CPU, GpuSpec, find_gpu, load_catalog
from ftplan.core.settings import PADDINGS, Setting
from ftplan.core.units import GIB
from ftplan.models.bytes_per_param import same_state_optimizers
from ftplan.models.communication.estimates import estimate_overlap, step_time_cv
from ftplan.models.communication.layout import describe_layout
from ftplan.models.communication.links import Links, links_from_catalog
from ftplan.models.communication.step import data_parallel_step_seconds
from ftplan.models.communication.traffic import DEFAULT_BACKWARD_FRACTION, step_traffic
from ftplan.models.fit import SettingFit
from ftplan.models.fitset import FitSet, fit_records
from ftplan.models.prediction import (
    SOURCE_EXTRAPOLATED,
    SOURCE_INTERPOLATED,
    SOURCE_MEASURED,
    SOURCE_PRIOR,
    Estimate,
    Prediction,
)
from ftplan.models.prior import (
    PriorConstants,
    PriorEstimate,
    accumulated_gradient_bytes,
    fit_constants,
    prior_estimate,
)

DEFAULT_INTER_NODE_LINK = "cloud"
# Share of the prior's attention-path change (a padding mask's expanded K/V and mask, packing's flattened mask) that
# the bound adds when the calibration ran other padding. The prior counts the masked excess to within 1.7% on the
# H200 (benchmarks/gpu/mask_path.py: 11 pairs, query/KV head ratios 1, 4 and 7) and packing's to 1.5%
# (benchmarks/gpu/packed_path.py); counting the whole change again had planned Llama-3-8B LoRA at 5 where 6 ran
# and Llama-3.2-1B with dynamic padding at 11 where 15 ran.
PADDING_CHANGE_MARGIN = 0.10
PADDING_WORDS = {"none": "equal-length rows, no mask", "max_length": "padded to seq_len, masked",
                 "longest": "padded to each batch's longest, masked", "packed": "flattened packed rows"}


@dataclass(frozen=True)
class _Evidence:
    """A fit to build on, the setting and GPU it was measured with, and how to reach the asked case."""

    fit: SettingFit
    setting: Setting
    gpu: GpuSpec
    note: str


class Predictor:
    """Per-GPU peak memory and seconds per step, from what `Predictor.fit` learned once.

    In the scikit-learn manner: `fit` does the work (the per-setting fits and the prior's constants,
    with the user's GPU catalog) and returns a predictor that only stores them; `predict` reads them
    and never learns anything (its memo is a cache, so thousands of planner calls stay fast). The
    planner caches the fitted parts on disk, keyed on the content of everything they depend on.
    """

    def __init__(self, records: list[dict], fits: FitSet, constants: dict[str, PriorConstants],
                 gpu_catalog: dict[str, GpuSpec], links: Links | None = None):
        """Built from fitted parts and a catalog already read: construction reads no file (Predictor.fit does)."""
        self._records = [r for r in records if r.get("status") in ("ok", "oom")]
        self._fits = fits
        self._constants = dict(constants)
        self._catalog = gpu_catalog
        self._links = links
        self._overlaps: dict[Links, float] = {}
        self._catalog_links: dict[str, Links] = {}
        self._evidence_cache: dict[tuple[Setting, GpuSpec], _Evidence | None] = {}
        self._cache: dict[tuple[Setting, int, GpuSpec], Prediction] = {}

    @classmethod
    def fit(cls, records: list[dict], gpu_catalog: dict[str, GpuSpec] | None = None,
            links: Links | None = None) -> Predictor:
        """Fit every setting's records and the prior's constants; the user's catalog names the cards."""
        catalog = gpu_catalog if gpu_catalog is not None else load_catalog()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # groups too small to fit still inform the prior
            fits = fit_records(records)
        return cls(records, fits, fit_all_constants(records, catalog), catalog, links)

    @property
    def fits(self) -> FitSet:
        return self._fits

    @property
    def constants(self) -> dict[str, PriorConstants]:
        return dict(self._constants)

    def with_links(self, links: Links | None) -> Predictor:
        """The same fitted predictor pricing communication over other links."""
        return Predictor(self._records, self._fits, self._constants, self._catalog, links)

    @cached_property
    def _fit_gpus(self) -> dict[str, GpuSpec]:
        return self._canonical_fit_gpus()

    @cached_property
    def _alloc_confs(self) -> list[str]:
        return sorted({str(r.get("alloc_conf", "")) for r in self._records})

    @cached_property
    def _seq_lens(self) -> dict[str, set[int]]:
        """The calibrated sequence lengths of each model, gathered once: the search asks for them per setting."""
        lengths: dict[str, set[int]] = {}
        for record in self._records:
            lengths.setdefault(record.get("model"), set()).add(record["seq_len"])
        return lengths

    @cached_property
    def _step_time_cv(self) -> float:
        return step_time_cv(self._records)

    def predict(self, setting: Setting, micro_batch: int, gpu: GpuSpec) -> Prediction:
        if micro_batch < 1:
            raise FtplanError(f"micro-batch must be >= 1, got {micro_batch}")
        key = (setting, micro_batch, gpu)
        if key not in self._cache:
            self._cache[key] = self._predict(setting, micro_batch, gpu)
        return self._cache[key]

    def constants_for(self, model: str) -> PriorConstants:
        """The prior's constants learned from this model's records, else from all records, else defaults."""
        return self._constants.get(model) or self._constants.get(ALL_MODELS) or PriorConstants()

    def _predict(self, setting: Setting, batch: int, gpu: GpuSpec) -> Prediction:
        arch = cached_architecture(setting.model)
        constants = self.constants_for(setting.model)
        prior = prior_estimate(arch, setting, batch, gpu, constants)
        if (setting, gpu) not in self._evidence_cache:
            self._evidence_cache[setting, gpu] = self._evidence(setting, gpu)
        evidence = self._evidence_cache[setting, gpu]
        if evidence is None:
            return self._from_prior(setting, batch, gpu, prior, constants)
        fit, seq = evidence.fit, setting.seq_len
        fit_seq = seq if fit.covers(seq) else min(fit.seq_lens, key=lambda s: abs(s - seq))
        base = prior_estimate(arch, evidence.setting, batch, evidence.gpu, constants)
        # Memory moves across lengths at the same tokens: the fit's error against the prior, read where the fit
        # holds as many tokens as this batch (at least its smallest calibrated batch: below it the fit's lines fall
        # under the static memory), rides on this setting's prior. Read at the same batch instead, it subtracted
        # the prior's 2,048-token activations from a fit that holds fewer: negative GiB at length 1.
        memory_batch = batch
        if fit_seq != seq:
            smallest = min(fit.calibrated_batches(fit_seq), default=1)
            if not _agrees_with_prior(fit, smallest, fit_seq, arch, evidence, constants):
                prediction = self._from_prior(setting, batch, gpu, prior, constants)
                return replace(prediction, notes=(*prediction.notes, f"the fit of {evidence.setting.label()} on "
                                                  f"{evidence.gpu.name} is over {CONTRADICTION_RATIO:g}x off the prior "
                                                  "at its own smallest batch: not carried to this length"))
            memory_batch = max(batch * seq / fit_seq, smallest)
        memory_base = base if memory_batch == batch else prior_estimate(arch, evidence.setting, memory_batch,
                                                                        evidence.gpu, constants)
        allocated = _shift(fit.peak_allocated(memory_batch, fit_seq), prior.peak_allocated - memory_base.peak_allocated)
        reserved = _shift(fit.peak_reserved(memory_batch, fit_seq), prior.peak_reserved - memory_base.peak_reserved)
        seconds = _transfer_time(fit.seconds_per_step(batch, fit_seq), base, prior)
        update = seconds.mean * _optimizer_share(prior)
        notes = [evidence.note] if evidence.note else []
        if setting.world_size > 1 and evidence.setting.world_size == 1:
            alone, seconds = seconds, self._with_communication(setting, gpu, seconds, prior)
            update += _once_per_update(setting, seconds.mean - alone.mean)
            notes.append(self._communication_note(setting))
        exact = evidence.setting == setting and evidence.gpu == gpu
        variant = not exact and evidence.gpu == gpu and _same_but_optimizer(evidence.setting, setting)
        padding_only = not exact and evidence.gpu == gpu and _same_but_padding(evidence.setting, setting)
        calibrated = fit.calibrated_batches(seq)
        inside = (exact or variant) and bool(calibrated) and calibrated[0] <= batch <= calibrated[-1]
        if (exact or variant) and not inside:
            notes.append(f"batch {batch} outside the calibrated batches {calibrated or 'at this length'}: extrapolated")
        if padding_only or variant:
            # only terms the prior counts differ: the bound adds the step temporaries' whole change (it does not count
            # on the prior's saving), or a share of the attention path's, which the prior counts closely
            share = PADDING_CHANGE_MARGIN if padding_only else 1.0
            allocated = _widened_by(allocated, share * abs(prior.peak_allocated - base.peak_allocated))
            reserved = _widened_by(reserved, share * abs(prior.peak_reserved - base.peak_reserved))
            seconds = _widened(seconds, constants.time_margin)
        elif not exact:
            # a relative's fit carries the prior's change: bound it by the prior's own measured error; but the same
            # recipe on a card of the same compute capability runs the same kernels, which allocate the same bytes
            # (H200 fits carried to an H100: allocated within 0.1%, packing 3%, on 21 rehearsals up to its capacity,
            # benchmarks/gpu/results/emitted_runs_*h100_2026-12-07.jsonl), so memory keeps the fit's bound there.
            # Time moves with the card's balance of throughput and bandwidth, which the datasheet ratio misses.
            if not (evidence.setting == setting and gpu.runs_the_kernels_of(evidence.gpu)):
                allocated = _widened(allocated, constants.memory_margin)
                reserved = _widened(reserved, constants.fragmentation_of(setting)[1])
            seconds = _widened(seconds, constants.time_margin)
        # Memory and time never fall as the batch or the length grows (`_monotone` says where they would have).
        allocated, reserved, seconds = self._monotone(setting, batch, gpu, fit, (allocated, reserved, seconds))
        reserved = _holding(reserved, allocated)
        wall = fit.observed_limit(seq) if exact else None  # a wall belongs to one card and one setting
        source = (SOURCE_MEASURED if exact and inside and batch in calibrated else SOURCE_INTERPOLATED if inside
                  else SOURCE_EXTRAPOLATED)
        return Prediction(setting, batch, gpu.name, allocated, reserved, seconds, source, wall_batch=wall,
                          measured_healthy=fit.measured_healthy(seq) if exact else (), notes=tuple(notes),
                          extrapolation=fit.allocated.extrapolation(memory_batch, fit_seq), update_seconds=update)

    def _monotone(self, setting: Setting, batch: int, gpu: GpuSpec, fit,
                  estimates: tuple[Estimate, Estimate, Estimate]) -> tuple[Estimate, Estimate, Estimate]:
        """(allocated, reserved, seconds) held between their neighbours on the calibrated grid.

        At a length between calibrated ones the relative's wider bound put 1,536 tokens above 2,048 (Llama-3.2-1B
        with checkpointing, batch 8: 49.10 against 48.96 GiB reserved) and 2,049 below 2,048; and beyond a
        calibrated batch the fit's next line came out lower, so eta called batch 33 safe where 32 was not
        (bounds 137.24 then 135.56 GiB). So: at most the next longer calibrated length's, at least the next
        shorter one's, and at least the largest smaller calibrated batch's (of this length's ladder, else of the
        nearest calibrated length's), each of which already holds its own neighbours.
        """
        seq, lengths = setting.seq_len, fit.seq_lens
        neighbours: list[tuple[Prediction, bool]] = []
        if seq not in lengths:
            longer = [length for length in lengths if length > seq]
            shorter = [length for length in lengths if length < seq]
            neighbours += [(self.predict(setting.with_(seq_len=longer[0]), batch, gpu), False)] if longer else []
            neighbours += [(self.predict(setting.with_(seq_len=shorter[-1]), batch, gpu), True)] if shorter else []
        ladder = fit.calibrated_batches(seq) or fit.calibrated_batches(min(lengths, key=lambda s: abs(s - seq)))
        below = [c for c in ladder if c < batch]
        neighbours += [(self.predict(setting, below[-1], gpu), True)] if below else []
        held = list(estimates)
        for neighbour, is_floor in neighbours:
            bound = _at_least if is_floor else _at_most
            held = [bound(estimate, other) for estimate, other in zip(held, (
                neighbour.peak_allocated, neighbour.peak_reserved, neighbour.seconds_per_step))]
        return held[0], held[1], held[2]

    def _from_prior(self, setting: Setting, batch: int, gpu: GpuSpec, prior: PriorEstimate,
                    constants: PriorConstants) -> Prediction:
        seconds = Estimate(prior.seconds_per_step, prior.seconds_per_step * (1 + constants.time_margin))
        update = prior.optimizer_seconds
        notes = [f"analytic prior, constants from {constants.scope}"
                 + (f" ({constants.n_records} records)" if constants.n_records else "")]
        if setting.quantization:  # QLoRA's own cost, which only a calibration of it measures
            notes.append("the prior prices a 4-bit base's step as LoRA's FLOPs: bitsandbytes dequantizes each linear "
                         "for every matmul, which it does not count, so the step is slower than this")
        if setting.world_size > 1:
            alone, seconds = seconds, self._with_communication(setting, gpu, seconds, prior)
            update += _once_per_update(setting, seconds.mean - alone.mean)
            notes.append(self._communication_note(setting))
        allocated = Estimate(prior.peak_allocated, prior.peak_allocated * (1 + constants.memory_margin))
        _, margin, worst = constants.fragmentation_of(setting)
        # the bound: the prior's own error, the allocated bound with the worst fragmentation seen near capacity, or
        # with the most cache seen at small batches
        reserved = Estimate(prior.peak_reserved, max(prior.peak_reserved * (1 + margin), allocated.upper * worst,
                                                     allocated.upper + constants.cached_bytes))
        return Prediction(setting, batch, gpu.name, allocated, reserved, seconds, SOURCE_PRIOR, notes=tuple(notes),
                          update_seconds=update)

    def _evidence(self, setting: Setting, gpu: GpuSpec) -> _Evidence | None:
        """The closest calibrated fit: this GPU first, then any GPU; this setting, then its relatives."""
        relatives = [(setting, "")]
        relatives += [(setting.with_(alloc_conf=conf), f"calibrated with PYTORCH_CUDA_ALLOC_CONF='{conf}'")
                      for conf in self._alloc_confs if conf != setting.alloc_conf]
        relatives += [(setting.with_(optimizer=other), f"calibrated with {other} (the same AdamW state; its step "
                       "temporaries shifted by the prior)") for other in same_state_optimizers(setting.optimizer)]
        relatives += [(setting.with_(padding=other), f"calibrated with padding '{other}' ({PADDING_WORDS[other]}), "
                       f"not this run's '{setting.padding}': the attention path's change is the prior's")
                      for other in PADDINGS if other != setting.padding]
        if setting.world_size > 1:
            relatives.append((setting.with_(gpus=1, nodes=1), "memory from the 1-GPU calibration plus the analytic change of partitioned states"))
        for candidate, note in relatives:
            for fit_gpu in self._gpu_order(gpu):
                fit = self._lookup(candidate, fit_gpu)
                if fit is None:
                    fit = self._other_length(candidate, fit_gpu)
                    if fit is None:
                        continue
                    note = "; ".join(filter(None, [note, f"fit at sequence length(s) {fit.seq_lens}, shifted by the prior to {setting.seq_len}"]))
                    candidate = candidate.with_(seq_len=min(fit.seq_lens, key=lambda s: abs(s - setting.seq_len)))
                if fit_gpu != gpu:
                    note = "; ".join(filter(None, [note, f"calibrated on {fit_gpu.name}: memory kept, time scaled by throughput and bandwidth"]))
                return _Evidence(fit, candidate, fit_gpu, note)
        return None

    def _gpu_order(self, gpu: GpuSpec) -> list[GpuSpec]:
        others = sorted({g for g in self._fit_gpus.values() if g != gpu}, key=lambda g: g.name)
        return [gpu, *others]

    def _lookup(self, setting: Setting, gpu: GpuSpec) -> SettingFit | None:
        for raw_name, canonical in self._fit_gpus.items():
            if canonical == gpu:
                fit = self._fits.lookup(setting, raw_name)
                if fit is not None:
                    return fit
        return None

    def _other_length(self, setting: Setting, gpu: GpuSpec) -> SettingFit | None:
        """A fit of the same setting at other sequence lengths (one length only; several would cover it)."""
        lengths = sorted(self._seq_lens.get(setting.model, ()), key=lambda s: abs(s - setting.seq_len))
        for length in lengths:
            fit = self._lookup(setting.with_(seq_len=length), gpu)
            if fit is not None:
                return fit
        return None

    def _canonical_fit_gpus(self) -> dict[str, GpuSpec]:
        """Record GPU names (e.g. 'NVIDIA H200') mapped to catalog cards; unknown cards are left out."""
        found = {}
        for name in sorted({fit.gpu_name for fit in self._fits.fits}):
            try:
                found[name] = find_gpu(name, self._catalog)
            except FtplanError:
                continue
        return found

    def _links_for(self, gpu: GpuSpec) -> Links:
        """The user's links, else the catalog's for this card's interconnect and a plain cloud network between nodes."""
        if self._links is not None:
            return self._links
        if gpu.interconnect not in self._catalog_links:
            try:
                links = links_from_catalog(intra=gpu.interconnect, inter=DEFAULT_INTER_NODE_LINK)
            except FtplanError:
                links = links_from_catalog(inter=DEFAULT_INTER_NODE_LINK)
            self._catalog_links[gpu.interconnect] = links
        return self._catalog_links[gpu.interconnect]

    def _with_communication(self, setting: Setting, gpu: GpuSpec, seconds: Estimate, prior: PriorEstimate) -> Estimate:
        """One GPU's step plus what data parallelism adds: the slowest rank, exposed collectives, offload
        transfers. Backward, behind which gradient buckets hide, is its share of the compute (not of the
        optimizer step or the per-step overhead)."""
        arch = cached_architecture(setting.model)
        traffic = step_traffic(setting, arch.params_total, arch.trainable_params(setting.lora_rank, setting.lora_targets))
        links = self._links_for(gpu)
        if links not in self._overlaps:
            self._overlaps[links] = estimate_overlap(self._records, links).overlap
        overlap, cv = self._overlaps[links], self._cv(links)
        compute_share = prior.compute_seconds / prior.seconds_per_step if prior.seconds_per_step > 0 else 1.0

        def total(compute: float) -> float:
            return data_parallel_step_seconds(compute, traffic.gradient_bytes, setting.gpus, setting.nodes, links,
                                              overlap, cv, DEFAULT_BACKWARD_FRACTION * compute_share,
                                              gathered_parameter_bytes=traffic.gathered_parameter_bytes,
                                              offloaded_bytes=traffic.offloaded_bytes)
        return Estimate(total(seconds.mean), total(seconds.upper))

    def _cv(self, links: Links) -> float:
        """The cluster's step-time spread when the user gave one, else the calibration records' own."""
        return links.step_time_cv if links.step_time_cv is not None else self._step_time_cv

    def _communication_note(self, setting: Setting) -> str:
        where = describe_layout(setting.gpus, setting.nodes)
        cv = self._links.step_time_cv if self._links is not None and self._links.step_time_cv is not None else self._step_time_cv
        return (f"step time adds modelled communication over {where} (ring or tree all-reduce in DDP's 25 MB "
                f"buckets behind backward) and waits for the slowest rank (step-time spread cv {cv:.3g})")


ALL_MODELS = ""  # the key of the constants learned from every record


def fit_all_constants(records: list[dict], catalog: dict[str, GpuSpec]) -> dict[str, PriorConstants]:
    """The prior's constants per calibrated model and from all records (key ALL_MODELS).

    A model's scales come from its own records; its margins are never narrower than the prior's error
    on a setting left out of all records (a model's few settings understate what an unseen one misses).
    The masked attention path's cost is pooled:
    it is the kernel's, and few models have the padded and unpadded pairs that measure it.
    """
    ok = [r for r in records if r.get("status") in ("ok", "oom")]
    every = fit_constants(ok, catalog, "all calibrations")
    constants = {ALL_MODELS: every}
    for model in sorted({str(r.get("model")) for r in ok}):
        mine = [r for r in ok if r.get("model") == model]
        own = fit_constants(mine, catalog, f"{model} calibrations", every.masked_attention_cost)
        if own.n_records:
            constants[model] = replace(own, memory_margin=max(own.memory_margin, every.memory_margin),
                                       reserved_margin=max(own.reserved_margin, every.reserved_margin),
                                       cached_bytes=max(own.cached_bytes, every.cached_bytes),
                                       checkpointed_reserved_margin=max(own.checkpointed_reserved_margin,
                                                                        every.checkpointed_reserved_margin),
                                       time_margin=max(own.time_margin, every.time_margin))
    return constants


def _widened(estimate: Estimate, margin: float) -> Estimate:
    """At least the relative margin above the mean."""
    return replace(estimate, upper=max(estimate.upper, estimate.mean * (1 + margin)))


def _at_least(estimate: Estimate, floor: Estimate) -> Estimate:
    return Estimate(max(estimate.mean, floor.mean), max(estimate.upper, floor.upper))


def _at_most(estimate: Estimate, ceiling: Estimate) -> Estimate:
    return Estimate(min(estimate.mean, ceiling.mean), min(estimate.upper, ceiling.upper))


def _holding(reserved: Estimate, allocated: Estimate) -> Estimate:
    """Reserved memory holds the allocated: a relative shifted by the prior's reserved change can fall below it (a
    Llama-3.2-1B Liger fit at 2,048 tokens moved to 64 at batch 100 came out at 1.5 GiB reserved, 28 allocated)."""
    return _at_least(reserved, allocated)


def _widened_by(estimate: Estimate, amount: float) -> Estimate:
    return replace(estimate, upper=estimate.upper + amount)


def _same_but_optimizer(calibrated: Setting, wanted: Setting) -> bool:
    """A calibration that differs only in the AdamW variant or the allocator's configuration: the same card,
    length and layout, so its measured batches stand for the wanted setting's up to the prior's shift."""
    return calibrated.with_(optimizer=wanted.optimizer, alloc_conf=wanted.alloc_conf) == wanted


def _same_but_padding(calibrated: Setting, wanted: Setting) -> bool:
    """A calibration of the same run with other padding: its measured batches stand for the wanted setting's up to
    the attention path's change, which the prior counts (PADDING_CHANGE_MARGIN)."""
    return calibrated.with_(padding=wanted.padding) == wanted


def with_accumulation(prediction: Prediction, accumulation: int) -> Prediction:
    """The prediction for a run that accumulates gradients over `accumulation` micro-steps: calibrations and the
    prior are at accumulation 1, and every micro-step after the first also holds the kept gradients
    (accumulated_gradient_bytes), so both memory peaks, their bounds and the measured peaks that prove a batch
    safe move up by them; a batch measured without accumulation is a relative here, not a measurement."""
    if accumulation <= 1:
        return prediction
    kept = accumulated_gradient_bytes(cached_architecture(prediction.setting.model), prediction.setting)
    if not kept:
        return prediction
    relative = SOURCE_EXTRAPOLATED if prediction.source in (SOURCE_MEASURED, SOURCE_INTERPOLATED) else prediction.source
    return replace(prediction, peak_allocated=_shift(prediction.peak_allocated, kept),
                   peak_reserved=_shift(prediction.peak_reserved, kept), source=relative,
                   measured_healthy=tuple((batch, peak + kept) for batch, peak in prediction.measured_healthy),
                   notes=(*prediction.notes, f"gradient accumulation keeps {kept / GIB:.2f} GiB of gradients "
                                             "through the micro-steps (calibrated without accumulation)"))


# A fit this many times off the prior where it was measured (either way) contradicts it: the prior's held-out
# memory error is a few % (`python -m benchmarks.prior_accuracy`), so the pair cannot both be right, and carrying
# the difference to another length gave nonsense (records at 16.8M tokens a sample read -1,023,858 GiB at 2,048).
CONTRADICTION_RATIO = 2.0


def _agrees_with_prior(fit, batch: int, seq: int, arch, evidence: _Evidence, constants: PriorConstants) -> bool:
    """Whether the fit and the prior are within CONTRADICTION_RATIO of each other at a calibrated point: decided
    once per fit, so a setting's predictions never switch between the two as the batch grows. A CPU fit always
    agrees: its memory is the process's peak RSS, the runtime's half GiB or so included, which the prior's tensors
    leave out (tiny-llama measured 0.65 GiB where the prior counts 0.10), so its ratio says nothing of its records."""
    if evidence.gpu.name == CPU:
        return True
    measured = fit.peak_allocated(batch, seq).mean
    counted = prior_estimate(arch, evidence.setting, batch, evidence.gpu, constants).peak_allocated
    return measured > 0 and counted > 0 and 1 / CONTRADICTION_RATIO <= measured / counted <= CONTRADICTION_RATIO


def _shift(estimate: Estimate, delta: float) -> Estimate:
    return replace(estimate, mean=estimate.mean + delta, upper=estimate.upper + delta)


def _optimizer_share(prior: PriorEstimate) -> float:
    """The optimizer step's share of the prior's step time, which a measured step time is split by."""
    return prior.optimizer_seconds / prior.seconds_per_step if prior.seconds_per_step > 0 else 0.0


def _once_per_update(setting: Setting, communication: float) -> float:
    """The communication an optimizer step pays once: DDP's all-reduce runs on the last micro-step only (the
    Trainer's no_sync before it); DeepSpeed's ZeRO reduces and moves gradients on every micro-step."""
    return 0.0 if setting.uses_deepspeed else communication


def _transfer_time(measured: Estimate, base: PriorEstimate, target: PriorEstimate) -> Estimate:
    """Scale a measured time from the calibrated case to the asked one, part by part, by the prior's ratios:
    compute by FLOPs over throughput, the optimizer step by its own (bandwidth- or CPU-bound) estimate."""
    if base.seconds_per_step <= 0:
        return measured
    compute_share = base.compute_seconds / base.seconds_per_step
    ratio = (compute_share * target.compute_seconds / max(base.compute_seconds, 1e-12)
             + (1 - compute_share) * target.optimizer_seconds / max(base.optimizer_seconds, 1e-12))
    return Estimate(measured.mean * ratio, measured.upper * ratio)

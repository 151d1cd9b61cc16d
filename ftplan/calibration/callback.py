"""FtplanCallback: every real Hugging Face Trainer run becomes a calibration record and a check of the plan.

Why a callback: users already train with Trainer, so one added line gives ftplan a measurement of
exactly the setup they care about, and gives them ftplan's prediction before a long run and its
error after it. It measures as a calibration trial does (ftplan.calibration.measure; peaks reset after
warm-up; each optimizer step timed between CUDA synchronisations) and writes the same record
contract with source="trainer_callback".

Nothing here may break the user's training: a failure inside the callback is reported in one line
and the callback turns itself off. The record is written once: at on_train_end, or, when training
is interrupted, from a SIGTERM handler or at interpreter exit (an uncaught out-of-memory error
becomes status "oom").

A batch that ran out of memory once is never recorded as healthy, even when the user's code caught
the error and went on (a retry loop, a skipped step, a notebook): later plans would trust it as
measured. The CUDA allocator counts every OOM it raises, and the model's forward hook sees one
raised in forward on any device. The callback takes part in no collective: on several ranks, a
rank whose callback failed would not join it, and the user's next collective would pair with ours
and hang the job; ranks leave their results to rank 0 in files beside the record instead.
"""

from __future__ import annotations

import atexit
import datetime as dt
import hashlib
import itertools
import json
import os
import shlex
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

try:
    from transformers import TrainerCallback
except ImportError as exc:  # the planner installs without it; the callback runs inside a Trainer, which needs it
    raise ImportError(f"FtplanCallback runs inside a Hugging Face Trainer and needs transformers ({exc}): install "
                      'torch for your platform, then pip install "ftplan[calibrate]"') from None

from ftplan.calibration import measure
from ftplan.calibration.launcher import RankOutcome, TrialOutcome
from ftplan.calibration.runner import measurements, pinned_machine_id
from ftplan.calibration.trainer_setting import run_architecture, setting_fields
from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu, load_catalog
from ftplan.core.paths import calibrations_dir
from ftplan.core.recipe import calibrate_command
from ftplan.evidence.inputs import load_evidence
from ftplan.evidence.workspace import Workspace
from ftplan.store.records import append_record, build_record
from ftplan.core.settings import Setting
from ftplan.core.units import GIB
from ftplan.models.bytes_per_param import same_state_optimizers
from ftplan.models.fit import fit_groups
from ftplan.models.fitset import FitSet
from ftplan.models.prediction import SOURCE_CALIBRATED, SOURCE_EXTRAPOLATED, Prediction

SOURCE = "trainer_callback"
RANKS_DIR = ".ftplan-ranks"  # beside the record: on a shared file system rank 0 sees other nodes' results too
PEER_WAIT_SECONDS = 10.0  # ranks end training within a step of each other; a rank whose callback failed never writes
RANK_START_SPREAD_SECONDS = 600.0  # a result file of another run with the same name is older than this
_TRAIN_CALLS = itertools.count(1)  # every rank calls train() as often as the others, so this numbers runs alike


def default_out() -> Path:
    """Where `ftplan calibrate` writes by default, so both kinds of record land in one file."""
    return measure.default_records_path()


class FtplanCallback(TrainerCallback):
    """Add to a Trainer to get ftplan's prediction at the start, a comparison at the end, and a calibration record.

    out: JSONL file the record is appended to. warmup_steps: optimizer steps left out of timing and
    of the memory peak (as in `ftplan calibrate`). predict: print the prediction and comparison.
    gpu: card to predict for (default: the one training runs on). seq_len: tokens per sample, only
    needed when the model's forward is never called with input_ids. handle_interruptions: while train()
    runs, a SIGTERM handler and sys.excepthook record a killed or crashed run (an uncaught OOM as "oom");
    False leaves both as the user's code set them (such a run is then recorded at exit, without its cause).
    """

    def __init__(self, out: str | Path | None = None, warmup_steps: int = 2, predict: bool = True,
                 gpu: str | None = None, seq_len: int | None = None, handle_interruptions: bool = True) -> None:
        self.out = Path(out if out is not None else default_out()).resolve()
        self.warmup_steps = warmup_steps
        self.predict = predict
        self.gpu = gpu
        self.seq_len = seq_len
        self.handle_interruptions = handle_interruptions
        self.step_seconds: list[float] = []
        self.record: dict | None = None
        self._run: _Run | None = None
        self._steps_done = 0  # in this call of train(): global_step starts high when resuming from a checkpoint
        self._step_started: float | None = None
        self._finished = False
        self._previous_sigterm = None

    # Trainer events ------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._guard(self._begin, args, state, model, getattr(train_dataloader, "collate_fn", None))

    def on_step_begin(self, args, state, control, **kwargs):
        self._guard(self._step_begin)

    def on_step_end(self, args, state, control, **kwargs):
        self._guard(self._step_end)

    def on_train_end(self, args, state, control, **kwargs):
        self._guard(self._finish, None)

    # Steps ---------------------------------------------------------------------------------------

    def _step_begin(self) -> None:
        if self._run is None or self._steps_done < self.warmup_steps:
            return
        if self._steps_done == self.warmup_steps:
            measure.reset_peak_memory(self._run.device)  # as in a trial: the peak of the measured steps
        self._run.sync()
        self._step_started = time.perf_counter()

    def _step_end(self) -> None:
        self._steps_done += 1
        if self._run is None:
            return
        self._run.note_oom()
        if self._step_started is None:
            return
        self._run.sync()
        self.step_seconds.append(time.perf_counter() - self._step_started)
        self._step_started = None

    # Start ---------------------------------------------------------------------------------------

    def _begin(self, args, state, model, collator=None) -> None:
        if self._run is not None and not self._finished:  # the last train() raised and the user's code caught it
            self._finish("train() was called again after this run raised")  # records it and restores the handlers
        self._finished, self.record, self.step_seconds, self._steps_done = False, None, [], 0
        self._run = _Run(args, state, model, self.seq_len, collator, config_dir=self.out.parent,
                         machine_id=measure.machine_id(pinned_machine_id(self.out)))
        self._run.on_first_forward = lambda: self._guard(self._announce)  # runs inside forward: must never raise
        if self.seq_len is not None:
            self._announce()
        atexit.register(self._at_exit)
        if not self.handle_interruptions:
            return
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._previous_excepthook, sys.excepthook = sys.excepthook, self._excepthook

    def _release(self) -> None:
        """Undo what _begin installed, so a finished run leaves the process as it found it."""
        atexit.unregister(self._at_exit)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm or signal.SIG_DFL)
        if self._run is not None:
            self._run.remove_hooks()

    def _announce(self) -> None:
        """Print the prediction for this run as soon as its sequence length is known."""
        run = self._run
        if not (self.predict and run.is_main):
            return
        try:
            run.prediction = _predict(run.setting(), run.micro_batch, self.gpu or run.gpu_name, self.out, run.machine_id)
        except Exception as exc:  # noqa: BLE001 - without a prediction the run is still worth recording
            run.prediction = str(exc) if isinstance(exc, FtplanError) else f"{type(exc).__name__}: {exc}"
        if isinstance(run.prediction, str):
            _say(f"ftplan: no prediction for this run: {run.prediction}")
            return
        _say(_prediction_text(run.prediction, run, self._capacity()))

    def _capacity(self) -> int:
        return find_gpu(self.gpu).memory_bytes if self.gpu else self._run.gpu_memory

    # End -----------------------------------------------------------------------------------------

    def _finish(self, interruption: BaseException | str | None) -> None:
        """Write the record once, on rank 0, with the results of the ranks that left theirs in time.

        On interruption other ranks may be gone, so rank 0 takes only the results already there.
        """
        if self._finished or self._run is None:
            return
        self._finished = True
        self._release()
        run = self._run
        run.note_oom()
        result = self._rank_result()
        if not run.is_main:
            run.share(result)
            return
        results = run.peer_results(result, wait=PEER_WAIT_SECONDS if interruption is None else 0.0)
        oom = next((f"rank {r['rank']}: {r['oom_seen']}" for r in results if r.get("oom_seen")), None)
        status, message = _status(interruption, len(self.step_seconds), run, oom)
        if status is None:
            _say(f"ftplan: training stopped ({message}); no step was measured, so no record was written")
            return
        missing = sorted(set(range(run.world_size)) - {r["rank"] for r in results})
        if missing:
            message = "; ".join(filter(None, [message, f"no measurements from rank(s) {', '.join(map(str, missing))}"]))
        setting = run.setting()
        outcome = TrialOutcome([RankOutcome(r["rank"], status, message, r) for r in results], time.time() - run.started)
        self.record = build_record(
            setting, run.micro_batch, status, message=message,
            timestamp=dt.datetime.fromtimestamp(run.started, dt.timezone.utc).isoformat(timespec="seconds"),
            source=SOURCE, machine_id=run.machine_id, device=run.device, arch_hash=run.arch.hash,
            command=shlex.join(sys.argv), trial_seconds=round(outcome.seconds, 3),
            gradient_accumulation_steps=run.grad_accum, trainable_dtype=run.trainable_dtype,
            prediction=_prediction_fields(run.prediction),
            **measurements(outcome, setting, run.micro_batch))
        if self.record["tokens_per_second"]:  # an optimizer step consumed grad_accum micro-batches
            self.record["tokens_per_second"] *= run.grad_accum
        if run.grad_accum == 1:  # a step of several micro-batches is no micro-batch's step: no fit could take it
            append_record(self.out, self.record)
        if self.predict:
            _say(_comparison_text(self.record, run.prediction, self.out))

    def _rank_result(self) -> dict:
        allocated, reserved, retries = measure.peak_memory(self._run.device)
        return {"rank": self._run.rank, "started": self._run.started, "oom_seen": self._run.oom_seen,
                "peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved, "num_alloc_retries": retries,
                "step_seconds": list(self.step_seconds), "params_total": self._run.arch.params_total,
                "params_trainable": self._run.params_trainable, "gpu_name": self._run.gpu_name,
                "gpu_memory_total_bytes": self._run.gpu_memory, "versions": measure.library_versions()}

    # Interruption --------------------------------------------------------------------------------

    def _excepthook(self, kind, value, traceback) -> None:
        self._guard(self._finish, value)
        self._previous_excepthook(kind, value, traceback)

    def _at_exit(self) -> None:
        self._guard(self._finish, "the process exited before training ended")

    def _on_sigterm(self, signum, frame) -> None:
        self._guard(self._finish, "SIGTERM")  # restores the previous handler, which the re-sent signal reaches
        os.kill(os.getpid(), signal.SIGTERM)

    def _guard(self, action, *args) -> None:
        """Run a callback action; a failure turns the callback off instead of breaking training."""
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - the user's training matters more than our record
            self._finished = True
            self._release()
            self._run = None
            _say(f"ftplan: callback disabled, nothing recorded: {type(exc).__name__}: {exc}")


class _Run:
    """What the callback reads from the Trainer run: setting, device, ranks, and the sequence length seen."""

    def __init__(self, args, state, model, seq_len: int | None, collator, config_dir: Path, machine_id: str) -> None:
        self.key = _run_key(str(args.output_dir), next(_TRAIN_CALLS))
        self.started = time.time()
        self.machine_id = machine_id
        self.device = args.device.type if args.device.type == "cuda" else "cpu"
        self.is_main = bool(state.is_world_process_zero)
        self.rank = int(args.process_index)
        self.ranks_dir = config_dir / RANKS_DIR
        self.world_size = int(args.world_size)
        self.micro_batch = int(args.per_device_train_batch_size)
        self.grad_accum = int(args.gradient_accumulation_steps)
        self.remaining_steps = max(0, int(state.max_steps or 0) - int(state.global_step))
        self.gpu_name, self.gpu_memory = measure.gpu_identity(self.device)
        self.arch = run_architecture(model, config_dir)
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.params_trainable = sum(getattr(p, "ds_numel", p.numel()) for p in trainable)
        # Setting has no field for it: pure-bf16 weights need less memory than the trials' fp32 ones
        self.trainable_dtype = str(trainable[0].dtype).removeprefix("torch.") if trainable else None
        self._fields = setting_fields(args, model, self.arch, collator)
        self.seq_len_given = seq_len  # only until a batch is seen: the record holds the shapes that ran
        self.seq_len_max: int | None = None
        self.seq_len_min: int | None = None
        self.prediction = None
        self.on_first_forward = lambda: None
        self.oom_seen: str | None = None
        self._ooms_at_start = _cuda_oom_count()  # a retry loop's earlier OOMs belong to earlier runs
        self._hooks = [model.register_forward_pre_hook(self._see_batch, with_kwargs=True),
                       model.register_forward_hook(self._see_failure, always_call=True)]
        if self.device == "cuda":
            import torch

            self.sync = torch.cuda.synchronize
        else:
            self.sync = lambda: None

    def _see_batch(self, module, args, kwargs) -> None:
        """Forward pre-hook: note the batch's sequence length (a shape read, no copy, no sync)."""
        if not module.training:
            return
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if tokens is None or tokens.dim() < 2:
            return
        length = int(tokens.shape[1])
        first = self.seq_len_max is None and length != self.seq_len_given  # predicted at begin for a given length
        self.seq_len_max = max(length, self.seq_len_max or 0)
        self.seq_len_min = min(length, self.seq_len_min or length)
        if first:
            self.on_first_forward()

    def _see_failure(self, module, args, output) -> None:
        """Forward hook, also run when forward raised (then output is None): note an OOM the user's code may catch."""
        error = sys.exc_info()[1]
        if output is None and module.training and self.oom_seen is None and error is not None and measure.is_oom(error):
            self.oom_seen = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"

    def note_oom(self) -> None:
        """Note an OOM the CUDA allocator raised since the run began, though training went on past it."""
        ooms = _cuda_oom_count() - self._ooms_at_start
        if ooms > 0 and self.oom_seen is None:
            self.oom_seen = f"the CUDA allocator raised {ooms} out-of-memory error(s)"

    def remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def setting(self) -> Setting:
        seq_len = self.seq_len_max or self.seq_len_given
        if seq_len is None:
            raise FtplanError("no training batch with input_ids was seen; pass seq_len= to FtplanCallback")
        return Setting(seq_len=seq_len, **self._fields)

    def share(self, result: dict) -> None:
        """Leave this rank's result for rank 0 in a file (written whole, then renamed into place)."""
        path = self._result_path(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(result))
        os.replace(partial, path)

    def peer_results(self, own: dict, wait: float) -> list[dict]:
        """This rank's result and those the other ranks left, waiting at most `wait` seconds for them."""
        paths = [self._result_path(rank) for rank in range(self.world_size) if rank != self.rank]
        deadline = time.monotonic() + wait
        while not all(p.exists() for p in paths) and time.monotonic() < deadline:
            time.sleep(0.1)
        peers = [_take_result(path, self.started) for path in paths]
        return [own, *(p for p in peers if p is not None)]

    def _result_path(self, rank: int) -> Path:
        return self.ranks_dir / f"{self.key}-rank{rank}.json"


def _run_key(output_dir: str, call: int) -> str:
    """The same on every rank of one train() call, found without talking: the launcher's rendezvous (torchrun,
    deepspeed and accelerate set MASTER_ADDR/PORT, torchrun a run id), the Trainer's output folder, the call."""
    names = [os.environ.get(n, "") for n in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")]
    return hashlib.sha256("|".join([*names, output_dir, str(call)]).encode()).hexdigest()[:16]


def _take_result(path: Path, started: float) -> dict | None:
    """A rank's result, removed once read; None when missing, unreadable or from another run of the same name."""
    try:
        result = json.loads(path.read_text())
        path.unlink()
        fresh = abs(float(result["started"]) - started) < RANK_START_SPREAD_SECONDS and isinstance(result["rank"], int)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return result if fresh else None


def _cuda_oom_count() -> int:
    """Out-of-memory errors the CUDA allocator raised in this process, caught or not (0 where CUDA is not in use)."""
    import torch

    return int(torch.cuda.memory_stats().get("num_ooms", 0))


def _predict(setting: Setting, micro_batch: int, gpu: str, out: Path, machine_id: str) -> Prediction | str:
    """ftplan's prediction for the run from the shipped calibrations and the user's own, or why there is none.

    On a CPU no card applies, so the prediction comes from this machine's own CPU calibrations
    (`ftplan calibrate --device cpu`) of the same setting, when there are some.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # skipped records and unfittable groups: not the user's problem here
        sources = [p for p in (calibrations_dir(), out) if p.exists()]
        if gpu != "cpu":  # the Workspace `ftplan plan` opens: the same records, links and fit, rehearsals left out
            return Workspace.open(gpu, sources).predict(setting, micro_batch)
        records = load_evidence(sources, load_catalog()).records  # the same reading, rehearsals left out
        own = [r for r in records if r.get("device") == "cpu" and r.get("machine_id") == machine_id]
        fits = FitSet(tuple(fit_groups(own)))
        same_state = [setting.with_(optimizer=o) for o in same_state_optimizers(setting.optimizer)]  # AdamW variants
        fit = next((f for s in (setting, *same_state) if (f := fits.lookup(s, "cpu")) is not None), None)
    if fit is None:
        return (f"training on CPU and this machine has no CPU calibration of {setting.label()} (run "
                f"`{calibrate_command(setting, on_cpu=True)}`, or pass FtplanCallback(gpu=...) to see what a card "
                "would need)")
    batches = fit.calibrated_batches(setting.seq_len)
    inside = bool(batches) and batches[0] <= micro_batch <= batches[-1]
    return Prediction(setting, micro_batch, "cpu", fit.peak_allocated(micro_batch, setting.seq_len),
                      fit.peak_reserved(micro_batch, setting.seq_len), fit.seconds_per_step(micro_batch, setting.seq_len),
                      SOURCE_CALIBRATED if inside else SOURCE_EXTRAPOLATED)


def _status(interruption: BaseException | str | None, steps_measured: int, run: _Run,
            oom_seen: str | None) -> tuple[str | None, str]:
    """Record status and message; (None, why) when there is nothing worth recording."""
    notes = []
    if interruption is not None:
        why = interruption if isinstance(interruption, str) else f"{type(interruption).__name__}: {interruption}"
        why = why.splitlines()[0][:300]
        if measure.is_oom(interruption):
            return "oom", f"out of memory after {steps_measured} measured step(s): {why}"
        notes.append(f"interrupted after {steps_measured} measured step(s): {why}")
    if oom_seen:
        return "oom", f"out of memory though training went on ({oom_seen}); {steps_measured} measured step(s)"
    if not steps_measured:
        return None, notes[0] if notes else "the run ended within the warm-up steps"
    if run.seq_len_min != run.seq_len_max:
        notes.append(f"sequence lengths varied {run.seq_len_min}-{run.seq_len_max}; seq_len is the longest")
    return "ok", "; ".join(notes)


def _prediction_fields(prediction) -> dict | None:
    """The prediction stored beside the measurement, so plan accuracy can be tracked over real runs."""
    if prediction is None or isinstance(prediction, str):
        return None
    return {"gpu": prediction.gpu, "source": prediction.source,
            "peak_allocated_bytes": prediction.peak_allocated.mean,
            "peak_reserved_bytes": prediction.peak_reserved.mean,
            "peak_reserved_bytes_upper": prediction.peak_reserved.upper,
            "seconds_per_step": prediction.seconds_per_step.mean}


def _prediction_text(prediction, run: _Run, capacity: int) -> str:
    per_step = prediction.step_seconds(run.grad_accum)
    lines = [f"ftplan prediction ({prediction.source}) for micro-batch {run.micro_batch} on {prediction.gpu}, "
             f"{run.setting().label()}:",
             f"  peak memory per GPU {prediction.peak_reserved.mean / GIB:.3g} GiB reserved "
             f"(up to {prediction.peak_reserved.upper / GIB:.3g}) of {capacity / GIB:.3g} GiB",
             f"  {per_step:.3g} s/optimizer step"
             + (f", about {_duration(per_step * run.remaining_steps)} for the {run.remaining_steps} steps to go"
                if run.remaining_steps else "")]
    if prediction.peak_reserved.mean > capacity:
        lines.insert(0, "!" * 72 + "\nftplan: THIS RUN IS PREDICTED NOT TO FIT IN GPU MEMORY (expect an out-of-memory error)")
        lines.append("!" * 72)
    elif prediction.peak_reserved.upper > capacity:
        lines.insert(0, "ftplan WARNING: this run may not fit: the upper memory bound exceeds the card")
    return "\n".join(lines)


def _comparison_text(record: dict, prediction: Prediction | str | None, out: Path) -> str:
    """Predicted vs measured, when the prediction was for the device that ran; else just what was measured."""
    measured_s = record.get("seconds_per_step")
    accum = record.get("gradient_accumulation_steps") or 1
    kept = (f"record appended to {out}" if accum == 1 else f"no record appended: a step of {accum} accumulated "
            "micro-batches is not a calibration of one (train with gradient_accumulation_steps=1 for one)")
    lines = [f"ftplan: measured {record['steps_measured']} step(s), status {record['status']}; {kept}"]
    if not isinstance(prediction, Prediction) or not _same_card(record["gpu_name"], prediction.gpu):
        where = f" (the prediction was for {prediction.gpu}, not {record['gpu_name']})" if isinstance(prediction, Prediction) else ""
        lines.append(f"  peak reserved {record['peak_reserved_bytes'] / GIB:.3g} GiB, "
                     + (f"{measured_s:.3g} s/step" if measured_s else "no step time") + where)
        return "\n".join(lines)
    rows = [("peak allocated (GiB)", prediction.peak_allocated.mean / GIB, record["peak_allocated_bytes"] / GIB),
            ("peak reserved (GiB)", prediction.peak_reserved.mean / GIB, record["peak_reserved_bytes"] / GIB),
            ("s/optimizer step", prediction.step_seconds(accum), measured_s)]
    lines.append(f"  {'':22}{'predicted':>11}{'measured':>11}{'error':>8}")
    for name, predicted, measured in rows:
        shown, error = (f"{measured:.3g}", f"{(predicted - measured) / measured:+.0%}") if measured else ("-", "-")
        lines.append(f"  {name:22}{predicted:11.3g}{shown:>11}{error:>8}")
    return "\n".join(lines)


def _same_card(measured_on: str, predicted_for: str) -> bool:
    if measured_on == predicted_for:
        return True
    try:
        return find_gpu(measured_on).name == predicted_for
    except FtplanError:
        return False


def _duration(seconds: float) -> str:
    return str(dt.timedelta(seconds=round(seconds)))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

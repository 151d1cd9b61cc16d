"""The end-to-end benchmark of issue 24: emitted configs, run as the user runs them, against the plan.

    python benchmarks/gpu/emitted_runs.py prepare WORK [GPU] [CASE ...]  # any machine: dataset, tokenizer, plans
                                                             # for GPU (default H200), --emit
    bash benchmarks/gpu/emitted_runs.sh WORK CASE[@B] ...  # on the GPU: `ftplan rehearse` of each (@B: at batch B)
    python benchmarks/gpu/emitted_runs.py report WORK RECORDS.jsonl
    python benchmarks/gpu/emitted_runs.py replay          # on any machine: today's models against those runs

The dataset is real text that ships offline: Python source files of the installed packages (a code
fine-tuning corpus, long-tailed lengths), tokenized by a byte-level BPE trained on it (tokenizer.json).
Each case is a `ftplan plan ... --emit` folder; `ftplan rehearse --no-lower` runs it unchanged (the folder's
training_args.py: arguments, collator, model loading) for 20 steps, the dataset's heaviest batches first, and
the report compares peak memory and step time with the plan's prediction.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

SAMPLES = 2400
MAX_CHARS = 200_000  # a file longer is a data table, not a sample
GIB = 2**30
# (name, model, plan options, --emit-setup label or None for the recommendation)
CASES = [
    ("qwen05-full-pad", "qwen2.5-0.5b", ["--full", "--precision", "bf16"], "ddp full s2048 padded"),
    ("qwen05-liger-dyn", "qwen2.5-0.5b", ["--full", "--dataset", "D", "--tokenizer", "T", "--seq-len", "2048"], "ddp liger full s2048 dynpad"),
    ("llama1b-full-dyn", "llama-3.2-1b", ["--full", "--dataset", "D", "--tokenizer", "T", "--seq-len", "2048"], "ddp full s2048 dynpad"),
    ("llama1b-offload-pad", "llama-3.2-1b", ["--full"], "zero2+offload full s2048 padded"),
    ("llama8b-lora-pad", "llama-3-8b", ["--lora"], "ddp lora16 s2048 padded"),
    ("llama8b-liger-lora-dyn", "llama-3-8b", ["--lora", "--dataset", "D", "--tokenizer", "T", "--seq-len", "2048"], None),
    ("qwen15-full-pad", "qwen1.5-0.5b", ["--full", "--dataset", "D", "--tokenizer", "T", "--seq-len", "2048", "--batching", "pad"],
     "ddp full s2048 padded"),
    ("qwen3-full-pad", "qwen3-1.7b", ["--full", "--precision", "bf16"], "ddp full s2048 padded"),
    ("gemma3-lora-pad", "gemma-3-1b", ["--lora"], "ddp lora16 s2048 padded"),
    # 2026-12-04 evening: the new families, three of them recommended from the prior alone (never calibrated)
    ("phi3-lora-gc-pad", "phi-3-mini-4k", ["--lora"], "ddp lora16 gc s2048 padded"),
    ("phi3-liger-lora-pad", "phi-3-mini-4k", ["--lora"], None),
    ("olmoe-lora-pad", "olmoe-1b-7b", ["--lora"], "ddp lora16 s2048 padded"),
    ("qlora8b-gc-pad", "llama-3-8b", ["--lora", "--allow", "qlora"], "ddp qlora16 gc s2048 padded paged_adamw_8bit"),
    ("qwen3-8b-liger-lora-pad", "qwen3-8b", ["--lora"], None),
    ("gemma2-liger-lora-pad", "gemma-2-2b", ["--lora"], None),
    ("phi4-liger-lora-pad", "phi-4", ["--lora"], None),
    # packing through TRL's SFTTrainer: WHEELS=.whlpack (trl, datasets, dill, multiprocess) for emitted_runs.sh
    ("qwen05-full-pack", "qwen2.5-0.5b", ["--full", "--dataset", "D", "--tokenizer", "T", "--seq-len", "2048",
                                          "--batching", "pack"], "ddp full s2048 packed"),
]


def corpus() -> list[str]:
    """Every SAMPLES-th share of the installed packages' Python sources, in a fixed order."""
    files = sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py"))
    texts = [t for t in (f.read_text(errors="replace") for f in files) if 20 < len(t) < MAX_CHARS]
    step = max(1, len(texts) // SAMPLES)
    return texts[::step][:SAMPLES]


def prepare(work: Path, gpu: str = "H200", names: list[str] | None = None) -> None:
    """The dataset, its tokenizer and every case's (or the named ones') emitted folder, planned for `gpu`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    work.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    dataset, tokenizer_path = work / "code.jsonl", work / "tokenizer.json"
    dataset.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=16000, show_progress=False))
    tokenizer.save(str(tokenizer_path))
    lengths = sorted(len(e.ids) for e in tokenizer.encode_batch(texts))
    print(f"dataset: {len(texts)} source files, p50 {lengths[len(lengths) // 2]}, "
          f"p99 {lengths[int(len(lengths) * 0.99)]}, max {lengths[-1]} tokens")
    for name, model, options, label in (c for c in CASES if not names or c[0] in names):
        options = [str(dataset) if o == "D" else str(tokenizer_path) if o == "T" else o for o in options]
        command = [sys.executable, "-m", "ftplan", "plan", "--model", model, "--gpu", gpu, *options,
                   *([] if "--dataset" in options else ["--dataset-size", str(len(texts))]),
                   "--emit", str(work / name), "--force", *(["--emit-setup", label] if label else [])]
        done = subprocess.run(command, capture_output=True, text=True)
        print(f"{name}: {'ok' if done.returncode == 0 else done.stderr.strip().splitlines()[-1]}")


def report(work: Path, records: Path) -> None:
    rows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    print(f"{'case':24} {'batch':>5} {'evidence':>14} {'outcome':>8} {'alloc GiB':>10} {'pred':>7} {'err':>6} "
          f"{'resv GiB':>9} {'pred':>7} {'s/step':>7} {'ETA s':>6} {'err':>6}")
    errors = []
    for name, *_ in CASES:
        plan_path = work / name / "plan.json"
        if not plan_path.exists():
            continue
        plan = json.loads(plan_path.read_text())
        digest_rows = [r for r in rows if r.get("emit_dir") == name]
        if not digest_rows:
            print(f"{name:24} {plan['micro_batch']:5d} {plan['predicted']['evidence']:>14} {'not run':>8}")
            continue
        planned = plan["rehearsals"][0]["micro_batch"] if plan["rehearsals"] else digest_rows[-1]["micro_batch"]
        run, predicted = next(r for r in digest_rows if r["micro_batch"] == planned), plan["predicted"]
        alloc, resv = run.get("peak_allocated_bytes") or 0, run.get("peak_reserved_bytes") or 0
        mixed = (run.get("step_seconds") or [])[run.get("heavy_steps", 0):]
        step = statistics.median(mixed) if mixed else float("nan")
        a_err = alloc / predicted["peak_allocated_bytes"] - 1
        t_err = step / predicted["seconds_per_step"] - 1
        errors.append((a_err, t_err))
        print(f"{name:24} {run['micro_batch']:5d} {predicted['evidence']:>14} {run['status']:>8} {alloc / GIB:10.2f} "
              f"{predicted['peak_allocated_bytes'] / GIB:7.2f} {a_err:+6.1%} {resv / GIB:9.2f} "
              f"{predicted['peak_reserved_bytes'] / GIB:7.2f} {step:7.3f} {predicted['seconds_per_step']:6.3f} "
              f"{t_err:+6.1%}")
    probes = [r for r in rows if "@" in str(r.get("emit_dir", ""))]
    if probes:
        print("\nthe same folders at a larger micro-batch (largest safe: reserved within the plan's usable memory):")
    for run in probes:
        name = run["emit_dir"].split("@")[0]
        plan = json.loads((work / name / "plan.json").read_text())
        usable, reserved = plan["usable_bytes"], run.get("peak_reserved_bytes") or 0
        safe = run["status"] == "ok" and reserved <= usable
        print(f"{name:24} planned {plan['micro_batch']:3d}, at {run['micro_batch']:3d}: {run['status']}, "
              f"{reserved / GIB:.2f} GiB reserved of {usable / GIB:.2f} usable: "
              f"{'safe, so planned/largest <= ' + format(plan['micro_batch'] / run['micro_batch'], '.0%') if safe else 'over: the planned batch is the largest safe one'}")
    grown = growth(rows, work)
    if grown:
        print("\nrehearse's search from the planned batch (the largest that ran inside the plan's usable memory):")
        print("\n".join(grown))
    if errors:
        print(f"{len(errors)} runs, {sum(1 for r in rows if r['status'] == 'oom' and '@' not in str(r.get('emit_dir')))} OOM; median |alloc err| "
              f"{statistics.median(abs(a) for a, _ in errors):.1%}, median |step err| "
              f"{statistics.median(abs(t) for _, t in errors):.1%}")


def growth(rows: list[dict], work: Path) -> list[str]:
    """Per folder rehearsed more than once: the planned batch (its first run), every batch tried, and the largest
    that ran safely, which the folder ends at."""
    lines = []
    for name in dict.fromkeys(r["emit_dir"] for r in rows if "@" not in r["emit_dir"]):
        runs = [r for r in rows if r["emit_dir"] == name]
        if len(runs) < 2:
            continue
        plan = json.loads((work / name / "plan.json").read_text())
        if not plan["rehearsals"]:  # a folder rehearsed before rehearse searched: its runs are of other plans
            continue
        usable = plan["usable_bytes"]
        safe = [r["micro_batch"] for r in runs if r["status"] == "ok" and r["peak_reserved_bytes"] <= usable]
        tried = ", ".join(f"{r['micro_batch']} ({r['peak_reserved_bytes'] / GIB:.1f} GiB)" for r in runs)
        planned, largest = runs[0]["micro_batch"], max(safe, default=0)
        lines.append(f"{name:24} planned {planned:3d}, largest safe {largest:3d} "
                     f"(planned/largest {planned / largest:.0%}): {tried}" if largest else f"{name:24} none safe: {tried}")
    return lines


RESULTS = Path(__file__).parent / "results"


def replayed(plan: dict, micro_batch: int, accumulation: int = 1):
    """Today's prediction for one rehearsed folder at the micro-batch and accumulation it ran (memory, seconds per
    optimizer step): memory at the planned length, with the gradients accumulation keeps; step time at the mean
    padded length of a random micro-batch of the plan's lengths (what the mixed steps feed), as `plan --dataset`
    predicts them."""
    from ftplan.core.settings import Setting
    from ftplan.evidence.workspace import Workspace
    from ftplan.models.batching import apply_limit, batching
    from ftplan.models.predictor import with_accumulation

    setting = Setting.from_dict(plan["setting"])
    workspace = Workspace.open(plan["gpu"])
    memory = with_accumulation(workspace.predict(setting, micro_batch), accumulation)
    lengths = plan.get("lengths")
    timing = memory
    if lengths:
        kept = apply_limit(lengths, plan.get("limit"), plan.get("too_long", "truncate")).lengths
        pack_length = plan["length"] if plan["strategy"] == "pack" else None
        length = max(1, round(batching(plan["strategy"], kept, micro_batch, pack_length=pack_length).time_length))
        timing = workspace.predict(setting.with_(seq_len=length), micro_batch)
    return memory, timing.optimizer_step(accumulation)


# (the records, the folders' plan.json as the rehearsals left them): 2026-12-04's probes, then its grown batches
REHEARSALS = ((RESULTS / "emitted_runs_h200.jsonl", RESULTS / "emitted_runs"),
              (RESULTS / "emitted_runs_grow_h200.jsonl", RESULTS / "emitted_runs_grow"))
# 2026-12-06, one H100 80GB HBM3 (driver 580.159.04; torch 2.11.0+cu130, transformers 5.17.0, trl 1.16.0): the
# packed folder planned for the H100 at micro-batch 3, then probed at 7, 8, 11 and 13 (`WHEELS=.whlpack bash
# benchmarks/gpu/emitted_runs.sh .gpu100 qwen05-full-pack qwen05-full-pack@7 ...`). Kept apart: its step time
# misses the target (`replay` prints it on its own). Then the same case planned with TRL's fused LM head
# priced (micro-batch 4), rehearsed with a probe at 11.
PACKED_REHEARSALS = ((RESULTS / "emitted_runs_pack_h100.jsonl", RESULTS / "emitted_runs_pack_h100"),
                     (RESULTS / "emitted_runs_pack_replanned_h100.jsonl", RESULTS / "emitted_runs_pack_replanned_h100"))
# The same H100 and versions, after SFTConfig(pad_to_multiple_of=max_length) pads every packed micro-batch to whole
# rows (so its shapes repeat and cuDNN's plans are reused): planned at 4, probed at 11, 12 and 13 (`WHEELS=.whlpack
# bash benchmarks/gpu/emitted_runs.sh .gpu100c qwen05-full-pack qwen05-full-pack@11 ...`).
WHOLE_ROW_REHEARSALS = ((RESULTS / "emitted_runs_pack_whole_rows_h100.jsonl",
                         RESULTS / "emitted_runs_pack_whole_rows_h100"),)
# 2026-12-07, one H100 80GB HBM3 (driver 580.159.04; torch 2.11.0+cu130, transformers 5.17.0): eight folders
# planned for the H100 from the H200's records (`prepare .gpuboth/H100 H100`), each rehearsed once unchanged at its
# planned batch for 20 steps (`WHEELS=.whl STEPS=20 REHEARSE_ARGS=--no-grow bash benchmarks/gpu/emitted_runs.sh
# .gpuboth/H100 llama8b-liger-lora-dyn qwen3-full-pad ...`): time carried across cards by the datasheet.
H100_REHEARSALS = ((RESULTS / "emitted_runs_h100_2026-12-07.jsonl", RESULTS / "emitted_runs_h100_2026-12-07"),)
# Later that day, the same H100 folders grown by rehearse (8 steps a run; `WHEELS=.whl STEPS=8 bash
# benchmarks/gpu/emitted_runs.sh .gpuboth/H100 qwen3-full-pad ...`): the largest batch each exact config runs.
H100_GROWN = ((RESULTS / "emitted_runs_grow_h100_2026-12-07.jsonl", RESULTS / "emitted_runs_grow_h100_2026-12-07"),)


def rehearsals(sources=REHEARSALS) -> list[tuple[dict, dict]]:
    """Every rehearsal of the emitted folders in `sources` (by default the H200's), with its folder's plan.json."""
    return [(run, json.loads((plans / run["emit_dir"].split("@")[0] / "plan.json").read_text()))
            for records, plans in sources
            for run in (json.loads(line) for line in records.read_text().splitlines() if line.strip())]


def replay() -> None:
    """Every rehearsal (probes and grown batches too) against what the shipped records predict for it now:
    held-out, end-to-end measurements (no rehearsal is in the package's records); the H200's, then packing's."""
    for title, sources in (("H200", REHEARSALS), ("packed, H100, a new flattened length every step", PACKED_REHEARSALS),
                           ("packed, H100, padded to whole rows", WHOLE_ROW_REHEARSALS),
                           ("H100, planned from the H200's records", H100_REHEARSALS)):
        print(f"{title}:\n{'run':28} {'batch':>8} {'evidence':>13} {'alloc err':>9} {'resv err':>8} {'s/step':>7} "
              f"{'pred':>6} {'err':>6}")
        errors = [_replay_row(run, plan) for run, plan in rehearsals(sources) if run.get("status") == "ok"]
        for label, chosen in (("calibrated", [e for e in errors if e[0] != "prior"]),
                              ("prior only", [e for e in errors if e[0] == "prior"])):
            if chosen:
                print(f"{label}: {len(chosen)} runs; |alloc err| median "
                      f"{statistics.median(abs(e[1]) for e in chosen):.1%} max {max(abs(e[1]) for e in chosen):.1%}; "
                      f"|step err| median {statistics.median(abs(e[3]) for e in chosen):.1%} "
                      f"max {max(abs(e[3]) for e in chosen):.1%}")


def _replay_row(run: dict, plan: dict) -> tuple[str, float, float, float]:
    """(evidence, allocated, reserved and step-time errors) of one rehearsal against today's prediction, printed."""
    memory, time = replayed(plan, run["micro_batch"], run.get("accumulation", 1))
    seconds = time.mean  # a step of the rehearsal is an optimizer step
    mixed = run["step_seconds"][run.get("heavy_steps", 0) + 1:]  # the first step also meets its shapes first
    step = statistics.median(mixed)
    row = (run["peak_allocated_bytes"] / memory.peak_allocated.mean - 1,
           run["peak_reserved_bytes"] / memory.peak_reserved.mean - 1, step / seconds - 1)
    batch = f"{run['micro_batch']}x{run.get('accumulation', 1)}"
    print(f"{run['emit_dir']:28} {batch:>8} {memory.source:>13} {row[0]:+9.1%} {row[1]:+8.1%} "
          f"{step:7.3f} {seconds:6.3f} {row[2]:+6.1%}")
    return (memory.source, *row)


def probe(work: Path, name: str, micro_batch: int) -> None:
    """A copy of a case's folder at another micro-batch (WORK/NAME@B), to find the largest batch that runs in that
    exact config: everything else, collator and allocator included, as emitted."""
    import shutil

    from ftplan.planner.emit import rewrite_rehearsed

    target = work / f"{name}@{micro_batch}"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(work / name, target)
    rewrite_rehearsed(target, micro_batch, 1, {"probe": micro_batch}, f"PROBE at micro-batch {micro_batch}")


if __name__ == "__main__":
    commands = {"prepare": lambda: prepare(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "H200", sys.argv[4:]),
                "report": lambda: report(Path(sys.argv[2]), Path(sys.argv[3])),
                "replay": replay,
                "probe": lambda: probe(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]]()

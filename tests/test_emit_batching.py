"""`plan --emit` with a batching strategy: the arguments carry the planned micro-batch × accumulation and sampler,
transformers accepts them as written, and training_args.py's collator pads to the shape the plan's memory assumed."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from ftplan.core.hardware import GpuSpec
from ftplan.core.settings import Setting
from ftplan.models.safe_batch import MemoryBudget
from ftplan.planner.dataset_plan import DatasetOptions, plan_from_lengths
from ftplan.planner.emit import DS_CONFIG, README, TRAINING_ARGS, TRAINING_ARGS_PY, write_configs
from ftplan.planner.search import PlanRequest, plan_setup
from ftplan.core.recipe import current_names
from tests.helpers import FakePredictor, run_ftplan

GPU = GpuSpec("TEST-80", 80, 100, 1000)
LENGTHS = np.array([10] * 95 + [60] * 5)  # a long tail: the longest sample (60) sets memory


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


@pytest.fixture(autouse=True)
def _alloc_conf_restored():
    """Importing training_args.py may set PYTORCH_CUDA_ALLOC_CONF for the process: start each test without it and
    leave the environment as it was (calibration records read it)."""
    before = os.environ.pop(ALLOC_CONF, None)
    yield
    os.environ.pop(ALLOC_CONF, None)
    if before is not None:
        os.environ[ALLOC_CONF] = before


def _emit(tmp_path, strategy: str, setting: Setting | None = None, gpu: GpuSpec = GPU, **options):
    setting = setting or Setting(model="llama-3-8b", lora_rank=16, seq_len=60)
    request = PlanRequest(base=setting, dataset_size=1, epochs=1.0, gpu=gpu, budget=MemoryBudget(GPU.memory_bytes),
                          lora_ranks=(16,), precision="bf16", training="lora")
    plan = plan_from_lengths(FakePredictor(), request, LENGTHS,
                             DatasetOptions(strategy=strategy, pack_length=64 if strategy == "pack" else None,
                                            **options))
    write_configs(tmp_path, plan.plan.recommended, plan.plan.request, dataset=plan)
    return plan.recommended


def _module(tmp_path):
    spec = importlib.util.spec_from_file_location("training_args", tmp_path / TRAINING_ARGS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[PAD]": 0, "a": 1}, unk_token="[PAD]"))
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]")


def _collate(module, lengths):
    features = [{"input_ids": [1] * n, "labels": [1] * n} for n in lengths]
    return module.data_collator(_tokenizer())(features)


@pytest.mark.parametrize("strategy", ["pad", "dynamic", "group", "pack"])
def test_emitted_arguments_are_the_planned_split_and_transformers_accepts_them(tmp_path, strategy):
    transformers = pytest.importorskip("transformers")
    choice = _emit(tmp_path, strategy, global_batch=8)
    kwargs = json.loads((tmp_path / TRAINING_ARGS).read_text())
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 8
    assert (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"]) == (
        choice.micro_batch, choice.accumulation)
    # this machine has no GPU: bf16 needs use_cpu here; on the training machine the files run as written
    args = transformers.TrainingArguments(**current_names(kwargs, transformers.TrainingArguments), use_cpu=True)
    module = _module(tmp_path)
    assert module.TRAINING_ARGS == kwargs
    if strategy == "pack":  # packing is TRL's SFTConfig (a TrainingArguments subclass), which collates itself
        pytest.importorskip("trl")
        config = module.training_arguments(use_cpu=True)
        assert (config.packing, config.packing_strategy, config.max_length) == (True, "bfd", choice.batching.memory_length)
        assert config.pad_to_multiple_of == config.max_length
        assert config.per_device_train_batch_size == args.per_device_train_batch_size
        assert module.data_collator(None) is None
        return
    from_py = module.training_arguments(use_cpu=True)
    assert from_py.per_device_train_batch_size == args.per_device_train_batch_size
    assert from_py.output_dir == str(tmp_path / "output")  # relative to the file, wherever train.py runs
    grouped = str(args.train_sampling_strategy).endswith("group_by_length")
    assert grouped == (strategy == "group")


def test_dynamic_padding_pads_each_micro_batch_to_its_longest_and_labels_with_minus_100(tmp_path):
    pytest.importorskip("transformers")
    _emit(tmp_path, "dynamic")
    batch = _collate(_module(tmp_path), [3, 7])
    assert tuple(batch["input_ids"].shape) == (2, 7)
    assert batch["labels"][0].tolist() == [1, 1, 1] + [-100] * 4


def test_the_emitted_collator_pads_with_eos_where_the_tokenizer_has_no_pad_token(tmp_path):
    """Llama 3's tokenizer has no pad token, and DataCollatorForSeq2Seq refused to pad a user's batch with it."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    _emit(tmp_path, "dynamic")
    words = Tokenizer(models.WordLevel({"<eos>": 0, "a": 1}, unk_token="<eos>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>")
    assert tokenizer.pad_token is None
    features = [{"input_ids": [1] * n, "labels": [1] * n} for n in (3, 5)]
    batch = _module(tmp_path).data_collator(tokenizer)(features)
    assert batch["input_ids"][0].tolist() == [1, 1, 1, 0, 0] and batch["labels"][0].tolist()[3:] == [-100, -100]


def test_the_emitted_collator_refuses_a_tokenizer_without_pad_or_eos_when_built(tmp_path):
    """A tokenizer.json trained with `tokenizers` has neither: the first batch failed inside Trainer.train()."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    _emit(tmp_path, "dynamic")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a")))
    with pytest.raises(ValueError, match="neither a pad nor an eos token: set tokenizer.pad_token first"):
        _module(tmp_path).data_collator(tokenizer)


@pytest.mark.parametrize("alloc_conf", ["expandable_segments:True", ""])
def test_the_emitted_module_sets_the_allocator_the_plan_was_made_for_before_cuda_allocates(tmp_path, alloc_conf):
    pytest.importorskip("transformers")
    setting = Setting(model="llama-3-8b", lora_rank=16, seq_len=48, padding="max_length", alloc_conf=alloc_conf)
    request = PlanRequest(base=setting, dataset_size=1000, epochs=1, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes))
    write_configs(tmp_path, plan_setup(FakePredictor(), setting, request), request)
    module_text = (tmp_path / TRAINING_ARGS_PY).read_text()
    assert module_text.index("ALLOC_CONF = ") < module_text.index("from transformers import")  # before torch loads
    _module(tmp_path)
    assert os.environ.get(ALLOC_CONF, "") == alloc_conf
    os.environ[ALLOC_CONF] = "backend:cudaMallocAsync"  # a value the user exported is kept, with a warning
    with pytest.warns(UserWarning, match="the plan was made for"):
        _module(tmp_path)
    assert os.environ[ALLOC_CONF] == "backend:cudaMallocAsync"


def test_pad_to_max_pads_every_sample_to_the_planned_length(tmp_path):
    pytest.importorskip("transformers")
    _emit(tmp_path, "pad")
    batch = _collate(_module(tmp_path), [3, 7])
    assert tuple(batch["input_ids"].shape) == tuple(batch["labels"].shape) == (2, 60)


def test_a_plan_without_a_dataset_pads_to_seq_len_at_the_largest_safe_batch(tmp_path):
    pytest.importorskip("transformers")
    setting = Setting(model="llama-3-8b", lora_rank=16, seq_len=48, padding="max_length")
    request = PlanRequest(base=setting, dataset_size=1000, epochs=1, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes))
    setup = plan_setup(FakePredictor(), setting, request)
    write_configs(tmp_path, setup, request)
    module = _module(tmp_path)
    assert module.TRAINING_ARGS["per_device_train_batch_size"] == setup.batch
    assert module.TRAINING_ARGS["gradient_accumulation_steps"] == 1
    assert tuple(_collate(module, [5, 9])["input_ids"].shape) == (2, 48)
    assert 'padding="longest"' in (tmp_path / README).read_text()  # says dynamic padding is the lighter choice


def test_truncation_and_dropping_are_said_where_the_tokenizer_is_called(tmp_path):
    _emit(tmp_path / "t", "dynamic", max_length=40)
    assert "truncation=True, max_length=40" in (tmp_path / "t" / TRAINING_ARGS_PY).read_text()
    _emit(tmp_path / "d", "dynamic", max_length=40, too_long="drop")
    assert "<= 40" in (tmp_path / "d" / TRAINING_ARGS_PY).read_text()
    _emit(tmp_path / "n", "dynamic")
    assert "max_length=" not in (tmp_path / "n" / TRAINING_ARGS_PY).read_text()


def test_zero_accumulation_matches_between_deepspeed_and_the_trainer(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("deepspeed")
    setting = Setting(model="llama-3-8b", zero_stage=2, seq_len=60)
    request = PlanRequest(base=setting, dataset_size=1, epochs=1.0, gpu=GPU, budget=MemoryBudget(GPU.memory_bytes),
                          precision="bf16", training="full")
    plan = plan_from_lengths(FakePredictor(full_static_gib=20), request, LENGTHS,
                             DatasetOptions(strategy="dynamic", global_batch=12), extra=[setting])
    (setup,) = [s for s in plan.plan.ranked if s.setting.zero_stage == 2 and not s.setting.offload_optimizer
                and not s.setting.liger and not s.setting.gradient_checkpointing]
    write_configs(tmp_path, setup, plan.plan.request, dataset=plan)
    choice = plan.setups[setup.setting]
    assert choice.accumulation > 1
    assert json.loads((tmp_path / DS_CONFIG).read_text())["gradient_accumulation_steps"] == choice.accumulation
    args = _module(tmp_path).training_arguments(use_cpu=True)
    config = args.hf_deepspeed_config.config  # the Trainer's own check of ds_config against its arguments
    assert config["train_batch_size"] == 12 and config["gradient_accumulation_steps"] == choice.accumulation
    assert isinstance(args, transformers.TrainingArguments)


def test_plan_cli_emits_the_dataset_plans_batch_and_says_how_to_use_it(tmp_path, capsys, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [0] * int(n)}) + "\n" for n in [100] * 990 + [1000] * 10))
    out = tmp_path / "configs"
    code, stdout, err = run_ftplan(["plan", "--model", "llama-3.2-1b", "--gpu", "H200", "--dataset", data,
                                    "--batching", "group", "--global-batch", "64", "--json", "--emit", out],
                                   capsys, monkeypatch)
    assert code == 0, err
    chosen = json.loads(stdout)["dataset"]["recommended"]
    kwargs = json.loads((out / TRAINING_ARGS).read_text())
    assert kwargs["per_device_train_batch_size"] == chosen["micro_batch"]
    assert kwargs["gradient_accumulation_steps"] == chosen["gradient_accumulation"]
    assert kwargs["train_sampling_strategy"] == "group_by_length"
    assert "from training_args import training_arguments, data_collator" in err


def test_the_length_limit_is_applied_where_the_run_applies_it():
    from ftplan.planner.emit_batching import PlannedBatch, length_limit_comment

    def comment(strategy: str, too_long: str) -> str:
        return " ".join(length_limit_comment(PlannedBatch(4, 1, strategy, 2048, 2048, too_long, True)))

    assert "SFTConfig(max_length=2048) truncates" in comment("pack", "truncate")  # TRL's best-fit decreasing does
    assert "truncation=True, max_length=2048" in comment("dynamic", "truncate")  # the collator never truncates
    assert "train.filter" in comment("pack", "drop")


def test_a_packed_micro_batch_flattens_to_whole_rows_so_its_shape_repeats_and_its_padding_trains_nothing():
    """What the emitted SFTConfig's pad_to_multiple_of relies on in TRL's padding-free collator: two rows of 64
    holding 50 and 61 tokens flatten to 128, the planned 2 x 64, and the padding is masked out of the loss and
    starts sequences of its own (position 0), so no real token attends to it."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=64)
    rows = [{"input_ids": [1] * 20 + [2] * 30, "seq_lengths": [20, 30]}, {"input_ids": [3] * 61, "seq_lengths": [61]}]
    batch = collate(rows)
    assert batch["input_ids"].shape == (1, 128)
    assert (batch["labels"][0, 111:] == -100).all() and (batch["position_ids"][0, 111:] == 0).all()
    assert torch.equal(batch["position_ids"][0, :111], torch.cat([torch.arange(20), torch.arange(30), torch.arange(61)]))

"""The analytic family table counts what transformers builds, and LoRA counts what PEFT trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftplan.core import architecture
from ftplan.core.architecture import (
    ALL_LINEAR_TARGETS,
    Architecture,
    analytic_structure,
    available_architectures,
    load_architecture,
)
from ftplan.core.errors import FtplanError
from ftplan.core.families import FAMILIES

FIXTURES = Path(__file__).parent / "fixtures" / "families"
TINY = sorted(str(p) for p in FIXTURES.glob("*.json"))
SHIPPED = available_architectures()


def _meta(arch: Architecture):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftplan.core.meta_count import meta_structure

    return meta_structure(arch.config)


def _assert_same(arch: Architecture) -> None:
    analytic, meta = analytic_structure(arch), _meta(arch)
    assert analytic.counts == meta.counts
    key = lambda linear: (linear.layer, linear.name)  # noqa: E731
    assert sorted(analytic.linears, key=key) == sorted(meta.linears, key=key)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_counts_what_transformers_builds_on_the_meta_device(name):
    _assert_same(load_architecture(name))


@pytest.mark.parametrize("path", TINY)
@pytest.mark.parametrize("flags", [{}, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
                                   {"tie_word_embeddings": False}])
def test_every_flag_a_family_reads_counts_what_transformers_builds(path, flags):
    config = {**json.loads(Path(path).read_text()), **flags}
    _assert_same(Architecture("tiny", config))


@pytest.mark.parametrize("path", TINY)
def test_keys_a_config_json_leaves_out_take_the_config_class_defaults(path):
    config = json.loads(Path(path).read_text())
    optional = ("tie_word_embeddings", "head_dim", "qkv_bias", "decoder_sparse_step")
    _assert_same(Architecture("tiny", {k: v for k, v in config.items() if k not in optional}))


def test_every_family_in_the_table_has_a_tiny_fixture():
    covered = {json.loads(Path(p).read_text())["model_type"] for p in TINY} | {"llama"}
    assert covered | {"mistral", "qwen2"} >= set(FAMILIES)


def test_published_totals_match():
    """Totals the model publishers state (Keras-Hub presets): a check independent of transformers."""
    assert load_architecture("phi-3-mini-4k").params_total == 3_821_079_552
    assert load_architecture("gemma-3-1b").params_total == 999_885_952


def test_moe_holds_every_expert_but_a_token_passes_through_top_k():
    arch = load_architecture("mixtral-8x7b")
    counts = arch.param_counts
    assert counts.experts == 32 * 8 * 3 * 14336 * 4096
    assert counts.router == 32 * 8 * 4096
    assert arch.active_decoder_params == pytest.approx(arch.decoder_params - counts.experts * 6 / 8)


def test_qwen_moe_keeps_mlp_only_layers_dense():
    arch = load_architecture(str(FIXTURES / "tiny-qwen3-moe.json"))
    assert arch.moe_layers == 1 and arch.param_counts.mlp == 3 * 64 * 96


def test_unknown_model_type_is_counted_on_the_meta_device():
    pytest.importorskip("transformers")
    config = {**json.loads((FIXTURES.parent.parent.parent / "ftplan/data/architectures/tiny-llama.json").read_text()),
              "model_type": "olmo"}
    arch = Architecture("olmo", config)
    assert arch.family is None and arch.structure.source == "meta device"
    assert arch.params_total == _meta(arch).counts.total


def test_unknown_model_type_without_torch_is_one_line_naming_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(architecture, "meta_counting_available", lambda: False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "starcoder2", "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}))
    with pytest.raises(FtplanError, match="install torch and transformers") as error:
        load_architecture(str(path))
    assert "\n" not in str(error.value)


def test_a_model_folder_with_config_json_loads(tmp_path):
    (tmp_path / "config.json").write_text((FIXTURES / "tiny-phi3.json").read_text())
    assert load_architecture(str(tmp_path)).model_type == "phi3"


def test_phi3_default_targets_name_its_fused_projections():
    arch = load_architecture("phi-3-mini-4k")
    assert arch.resolve_lora_targets(ALL_LINEAR_TARGETS) == ("o_proj", "qkv_proj", "gate_up_proj", "down_proj")
    with pytest.raises(FtplanError, match="qkv_proj"):
        arch.lora_params(8, ("q_proj",))


def _peft_trainable(arch: Architecture, rank: int) -> tuple[int, int]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    lora = LoraConfig(r=rank, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora).get_nb_trainable_parameters()


@pytest.mark.parametrize("name", [*TINY, "phi-3-mini-4k", "qwen1.5-moe-a2.7b", "olmoe-1b-7b", "qwen3-8b"])
def test_lora_all_linear_trains_what_peft_counts(name):
    arch = load_architecture(name)
    trainable, total = _peft_trainable(arch, 8)
    assert arch.lora_params(8) == trainable
    assert total == arch.params_total + trainable


@pytest.mark.parametrize("name", [*TINY, "phi-3-mini-4k", "olmoe-1b-7b"])
def test_a_live_all_linear_run_reads_as_the_default_targets_with_peft_trainable_count(name):
    """The Trainer callback reads a user's PEFT model: all-linear, however PEFT expanded it (target_modules and,
    on an MoE, target_parameters), is the calibrations' default targets, and ftplan counts what PEFT trains."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.calibration.trainer_setting import lora_setting

    arch = load_architecture(name)
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    with torch.device("meta"):
        model = get_peft_model(AutoModelForCausalLM.from_config(config),
                               LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    rank, targets = lora_setting(model, arch)
    assert (rank, targets) == (8, ALL_LINEAR_TARGETS)
    assert arch.lora_params(rank, targets) == model.get_nb_trainable_parameters()[0]


def test_explicit_targets_leave_the_experts_out():
    arch = load_architecture("olmoe-1b-7b")
    attention_only = arch.lora_params(8, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert arch.lora_params(8) - attention_only == 16 * arch.expert_lora_params_per_layer(8)


def test_lora_on_fused_experts_saves_one_merged_copy_of_each_layers_experts():
    """PEFT's expert LoRA adds B·A to the stacked experts in forward, and the grouped matmul keeps the sum for
    backward: the tensors shaped like a layer's stacked expert weights that autograd saves are what the prior
    counts as merged_expert_bytes (under checkpointing only the layer being recomputed holds its copy)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftplan.core.settings import Setting
    from ftplan.models.prior import merged_expert_bytes

    arch = load_architecture(str(FIXTURES / "tiny-olmoe.json"))
    config = AutoConfig.for_model(**{k: v for k, v in arch.config.items() if not k.startswith("_")})
    model = get_peft_model(AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16),
                           LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    stacked = {tuple(p.shape) for n, p in model.named_parameters() if "experts" in n and "lora" not in n}
    stacked |= {(e, o, i) for e, i, o in stacked}  # the grouped matmul may keep it transposed
    saved = []

    def pack(tensor):
        if tuple(tensor.shape) in stacked:
            saved.append(tensor.numel() * tensor.element_size())
        return tensor

    tokens = torch.randint(0, arch.vocab, (1, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=tokens, labels=tokens)
    setting = Setting(model=str(FIXTURES / "tiny-olmoe.json"), lora_rank=4, precision="bf16")
    assert sum(saved) == merged_expert_bytes(arch, setting) > 0
    one_layer = merged_expert_bytes(arch, setting.with_(gradient_checkpointing=True))
    assert one_layer * arch.moe_layers == sum(saved)

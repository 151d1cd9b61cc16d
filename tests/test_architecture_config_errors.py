"""A bad model config is one clear FtplanError at load, never a ZeroDivisionError later or a negative GiB;
a path that does not exist or a folder says so, and a local Hugging Face model folder loads its config.json."""

from __future__ import annotations

import json

import pytest

from ftplan.core.architecture import load_architecture
from ftplan.core.errors import FtplanError
from tests.helpers import run_ftplan

TINY = {k: v for k, v in load_architecture("tiny-llama").config.items() if not k.startswith("_")}

BAD_CONFIGS = {
    "zero heads": ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer up to 16777216, got 0"),
    "hidden size as text": ({"hidden_size": "256"}, "hidden_size must be a positive integer up to 16777216, got '256'"),
    "NaN layers": ({"num_hidden_layers": float("nan")}, "num_hidden_layers must be a positive integer up to 16777216, got nan"),
    "negative intermediate": ({"intermediate_size": -688}, "intermediate_size must be a positive integer up to 16777216, got -688"),
    "absurd vocab": ({"vocab_size": 10**30}, "vocab_size must be a positive integer"),
    "zero kv heads": ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer up to 16777216, got 0"),
    "heads not a multiple of kv heads": ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads"),
    "hidden not a multiple of heads": ({"hidden_size": 250}, "hidden_size 250 is not a multiple of num_attention_heads 4"),
    "flag as text": ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    "model type as list": ({"model_type": ["llama"]}, "model_type ['llama'] not supported"),
    "top-k above the experts": ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 9},
                                "num_experts_per_tok 9 is more than the 8 experts"),
    "no context": ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive integer"),
}


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_an_impossible_config_is_one_clear_error_at_load(tmp_path, name):
    changes, words = BAD_CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY, **changes}))
    with pytest.raises(FtplanError) as raised:
        load_architecture(str(path))
    assert words in str(raised.value) and str(path) in str(raised.value)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"[" * 100_000, b"[1, 2]"])
def test_a_config_that_is_not_a_json_object_is_one_clear_error(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(FtplanError, match="cannot read model config|is not a JSON object"):
        load_architecture(str(path))


@pytest.mark.parametrize("given", ["missing/config.json", "missing.json", "./missing"])
def test_a_config_path_that_does_not_exist_says_so_not_unknown_model(tmp_path, monkeypatch, given):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FtplanError, match="does not exist") as raised:
        load_architecture(given)
    assert "unknown model" not in str(raised.value)


def test_a_folder_without_config_json_says_so(tmp_path):
    with pytest.raises(FtplanError, match="folder without a config.json"):
        load_architecture(str(tmp_path))


def test_a_local_hugging_face_model_folder_loads_its_config_json(tmp_path):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    arch = load_architecture(str(folder))
    assert arch.id == "my-llama"
    assert arch.params_total == load_architecture("tiny-llama").params_total


def test_the_cli_prints_one_line_for_a_non_utf8_config(tmp_path, capsys, monkeypatch):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff"}')
    code, _out, err = run_ftplan(["calibrate", "--model", path, "--device", "cpu", "--out", tmp_path / "c.jsonl"],
                                 capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: cannot read model config"), err


@pytest.mark.parametrize("model_type", ["falcon", "dbrx"])
def test_a_model_class_that_refuses_the_config_its_own_way_is_one_line(tmp_path, capsys, monkeypatch, model_type):
    """Falcon's config raised AttributeError and DBRX's a huggingface_hub validation error: tracebacks, exit 1."""
    pytest.importorskip("transformers")
    config = load_architecture("llama-3.2-1b").config
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in config.items() if not k.startswith("_")} | {"model_type": model_type}))
    code, _, err = run_ftplan(["predict", "--model", path, "--batch-size", 4, "--gpu", "H100"], capsys, monkeypatch)
    assert code == 2 and f"error: transformers cannot build a causal LM of model_type '{model_type}'" in err


def test_an_encoder_is_refused_not_planned_as_a_decoder(tmp_path, capsys, monkeypatch):
    """BERT and RoBERTa built as causal LMs were planned with LoRA on q_proj..down_proj, which they do not have."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(transformers.BertConfig().to_dict(), default=str))
    code, _, err = run_ftplan(["predict", "--model", path, "--batch-size", 4, "--gpu", "H100"], capsys, monkeypatch)
    assert code == 2 and "model_type 'bert' has no decoder layers" in err, err


def test_a_multimodal_config_says_where_its_language_model_is(tmp_path):
    """Gemma 3 4B's config keeps its sizes in text_config: 'not a decoder-only model config: missing hidden_size,
    ...' named five keys that are there, one level down."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                                "text_config": TINY, "vision_config": {"hidden_size": 1152}}))
    with pytest.raises(FtplanError, match="multimodal model's config .* text_config"):
        load_architecture(str(path))


@pytest.mark.parametrize("changes, words", [
    ({"architectures": ["LlamaForSequenceClassification"]}, "planned as a causal language model"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "pre-quantized weights (gptq): planned as bf16"),
])
def test_a_config_planned_as_something_else_says_so_at_the_top_of_the_plan(tmp_path, capsys, monkeypatch, changes,
                                                                             words):
    """A classification head and GPTQ weights were planned as a plain bf16 causal LM without a word."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**load_architecture("llama-3.2-1b").config, **changes}))
    code, out, err = run_ftplan(["plan", "--model", path, "--gpu", "H200", "--dataset-size", 1000, "--json"],
                                capsys, monkeypatch)
    assert code == 0 and any(words in line for line in json.loads(out)["headline"]), err
    code, _, err = run_ftplan(["predict", "--model", path, "--batch-size", 2], capsys, monkeypatch)
    assert code == 0 and words in err
    assert not load_architecture("llama-3.2-1b").caveats

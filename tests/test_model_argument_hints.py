"""--model: a Hugging Face Hub id gets a hint that ftplan reads only local configs, and a config.json far larger
than any config is refused before it is read."""

from __future__ import annotations

import pytest

from ftplan.core.architecture import MAX_CONFIG_BYTES, load_architecture
from ftplan.core.errors import FtplanError


def test_a_hub_id_is_told_ftplan_cannot_download(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FtplanError, match="Hugging Face Hub id: ftplan cannot download, so pass a local config.json"):
        load_architecture("meta-llama/Meta-Llama-3-8B")


@pytest.mark.parametrize("hub_id, shipped", [("meta-llama/Llama-3.2-1B", "llama-3.2-1b"),
                                             ("Qwen/Qwen2.5-0.5B", "qwen2.5-0.5b"), ("mistralai/Mistral-7B-v0.1", None)])
def test_a_hub_id_with_a_dot_gets_the_hint_and_the_shipped_architecture_it_names(tmp_path, monkeypatch, hub_id,
                                                                                  shipped):
    """The part after the dot was taken for a file suffix: 'Llama-3.2-1B' got no hint at all."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FtplanError, match="Hugging Face Hub id") as raised:
        load_architecture(hub_id)
    assert (f"or the shipped '{shipped}'" in str(raised.value)) == (shipped is not None), raised.value


def test_a_config_json_larger_than_any_config_is_refused_unread(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    with (folder / "config.json").open("wb") as handle:
        handle.truncate(MAX_CONFIG_BYTES + 1)  # sparse
    with pytest.raises(FtplanError, match="over 16 MiB"):
        load_architecture(str(folder))

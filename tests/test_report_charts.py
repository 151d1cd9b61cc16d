"""`ftplan report` charts say which model, length and card each panel shows, and compare only like with like."""

from __future__ import annotations

import math


from ftplan.core.hardware import find_gpu
from ftplan.core.settings import Setting
from ftplan.models.safe_batch import MemoryBudget
from ftplan.cli.plots import Curves, above_ideal_notes, completion_panels

H200 = find_gpu("H200")


def _curves(model: str, seq_len: int, safe_batch: int = 4) -> Curves:
    setting = Setting(model=model, seq_len=seq_len)
    return Curves(setting.label(), setting, H200, MemoryBudget(H200.memory_bytes), [], [], [1, 2, 3, 4],
                  [(1.0, 1.0)] * 4, [1.0] * 4, [(1.0, 1.0)] * 4, safe_batch)


def test_panel_titles_name_the_model_so_two_models_with_one_setting_read_apart():
    small, large = _curves("qwen2.5-0.5b", 2048), _curves("llama-3-8b", 2048)
    assert small.label == large.label  # "ddp full s2048": what two panels used to be titled
    assert small.title != large.title and small.title.startswith("qwen2.5-0.5b") and "on H200" in large.title


def test_time_to_completion_compares_only_runs_of_one_model_length_and_card():
    short_small, long_small, long_large = (_curves("qwen2.5-0.5b", 512), _curves("qwen2.5-0.5b", 2048),
                                           _curves("llama-3-8b", 2048))
    panels = completion_panels([short_small, long_small, long_large, _curves("llama-3-8b", 2048, safe_batch=0)])
    assert set(panels) == {("qwen2.5-0.5b", 512, "H200"), ("qwen2.5-0.5b", 2048, "H200"), ("llama-3-8b", 2048, "H200")}
    assert all(len(group) == 1 for group in panels.values())  # no "best" line across models or lengths


def test_every_efficiency_above_100_percent_on_the_scaling_chart_is_explained():
    import pandas as pd  # here, not at the top: collecting the suite loads no pandas

    table = pd.DataFrame({"gpus": [1, 2, 4], "efficiency": [1.0, 1.7, 0.9], "speedup": [1.0, 3.4, 3.6]})
    explained = table.assign(above_ideal=["", "CPU offload is no longer needed at 2 GPUs", ""])
    notes = above_ideal_notes({"full": table, "lora": explained})
    assert len(notes) == 2 and all("at 2 GPUs, 170%" in note for note in notes)
    assert "larger batch or a setup without CPU offload" in notes[0]
    assert notes[1].endswith("CPU offload is no longer needed at 2 GPUs")
    assert not above_ideal_notes({"full": table.assign(efficiency=[1.0, 1.001, math.nan])})


def test_a_completion_line_of_unpadded_rows_says_so():
    """'fastest calibrated: ddp liger lora16, batch 10' read as plan's answer, which pads (batch 9)."""
    from dataclasses import replace

    from ftplan.cli.plots import _completion_label

    unpadded = _curves("llama-3-8b", 2048)  # Setting's default padding: rows of exactly seq_len
    padded = replace(unpadded, setting=unpadded.setting.with_(padding="max_length"),
                     label=unpadded.setting.with_(padding="max_length").label())
    assert (_completion_label(unpadded, 2048), _completion_label(padded, 2048)) == ("ddp full unpadded", "ddp full padded")

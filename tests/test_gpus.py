"""`ftplan gpus`: the catalog, and user specs that replace or add cards."""

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu
from tests.helpers import run_ftplan

REQUIRED = ("RTX-3090", "RTX-4090", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "H100", "H200")


def test_catalog_lists_the_common_training_gpus_with_sources(capsys, monkeypatch):
    code, out, err = run_ftplan(["gpus"], capsys, monkeypatch)
    assert code == 0, err
    for name in REQUIRED:
        assert name in out
    assert "datasheet" in out and "NVLink" in out


def test_user_specs_override_and_extend_the_catalog(tmp_path, capsys, monkeypatch):
    specs = tmp_path / "mine.csv"
    specs.write_text("name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs,source\n"
                     "H200,120,989,4800,my partitioned card\nMY-CARD,48,200,900,my measurement\n")
    code, out, err = run_ftplan(["gpus", "--gpu-specs", specs], capsys, monkeypatch)
    assert code == 0, err
    h200 = next(line for line in out.splitlines() if "H200" in line)
    assert "120" in h200 and "H200: my partitioned card" in out
    assert "MY-CARD" in out and "RTX-3090" in out


@pytest.mark.parametrize("device_name, card", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"),
                                               ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
                                               ("NVIDIA GeForce RTX 3090", "RTX-3090")])
def test_the_name_torch_gives_a_card_finds_it(device_name, card):
    """Records carry torch.cuda.get_device_name(); an H100's calibrations were once refused as an unknown GPU."""
    assert find_gpu(device_name).name == card


def test_a_card_of_another_form_factor_is_not_taken_for_the_sxm_one():
    with pytest.raises(FtplanError, match="unknown GPU 'NVIDIA H100 PCIe'"):
        find_gpu("NVIDIA H100 PCIe")

"""`ftplan gpus`: the catalog, and user specs that replace or add cards."""

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

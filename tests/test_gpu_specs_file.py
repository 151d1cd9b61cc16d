"""--gpu-specs FILE: every value checked in one line (optional columns too), names kept as text, a FIFO refused
at once, and the row's intra_node_gbs used for the links between its GPUs."""

from __future__ import annotations

import os

import pytest

from ftplan.core.errors import FtplanError
from ftplan.core.hardware import find_gpu, load_catalog
from tests.helpers import run_ftplan, within

HEADER = "name,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs,intra_node_gbs,torch_total_gib"
PLAN = ["plan", "--model", "llama-3.2-1b", "--dataset-size", "10000", "--gpus", "8"]


def specs(tmp_path, row: str):
    path = tmp_path / "specs.csv"
    path.write_text(f"{HEADER}\n{row}\n")
    return path


@pytest.mark.parametrize("row, words", [
    ("MINE,80,989,3350,0,", "intra_node_gbs must hold positive numbers"),
    ("MINE,80,989,3350,-5,", "intra_node_gbs must hold positive numbers"),
    ("MINE,80,989,3350,abc,", "intra_node_gbs must hold positive numbers"),
    ("MINE,80,989,3350,,abc", "torch_total_gib must hold positive numbers"),
    ("MINE,80,989,3350,1e300,", "above 1e+07"),
    ("MINE,80,989,3350,,1e300", "above 1e+07"),
    (",80,989,3350,,", "every row needs a name"),
    ("MINE,80,989,3350,,100", "MINE's torch_total_gib 100 is above its memory_gib 80"),
])
def test_a_bad_value_is_a_one_line_error_naming_its_column(tmp_path, capsys, monkeypatch, row, words):
    code, _out, err = run_ftplan([*PLAN, "--gpu", "MINE", "--gpu-specs", specs(tmp_path, row)], capsys, monkeypatch)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_card_of_two_rows_is_refused_and_a_shipped_name_in_any_case_is_replaced(tmp_path, capsys, monkeypatch):
    """Two rows of one card were resolved silently (the last won), and a user's 'h200' row hid beside the shipped
    H200, which --gpu h200 still found."""
    code, _out, err = run_ftplan([*PLAN, "--gpu", "MINE", "--gpu-specs", specs(tmp_path, "MINE,80,989,3350,,\nmine,40,989,3350,,")],
                                 capsys, monkeypatch)
    assert code == 2 and "has more than one row" in err
    catalog = load_catalog(specs(tmp_path, "h200,100,989,4800,,"))
    assert "H200" not in catalog and catalog["h200"].memory_gib == 100


def test_a_numeric_name_stays_a_name(tmp_path):
    catalog = load_catalog(specs(tmp_path, "5090,32,209,1792,,"))
    assert catalog["5090"].name == "5090"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "specs.csv"
    os.mkfifo(fifo)
    with within(10), pytest.raises(FtplanError, match="not a regular file"):
        load_catalog(fifo)


@pytest.mark.parametrize("gbs", ["900", "5"])
def test_the_rows_intra_node_bandwidth_prices_the_links_inside_a_node(tmp_path, capsys, monkeypatch, gbs):
    path = specs(tmp_path, f"MINE,80,989,3350,{gbs},")
    code, out, err = run_ftplan([*PLAN, "--gpu", "MINE", "--gpu-specs", path], capsys, monkeypatch)
    assert code == 0, err
    assert f"inside a node {gbs} GB/s" in out and "intra_node_gbs of MINE in your GPU specs" in out


@pytest.mark.parametrize("bandwidth", ["1e309", "1e-320"])  # infinity; a subnormal whose inverse is infinity
def test_an_infinite_or_vanishing_inter_node_bandwidth_is_refused(capsys, monkeypatch, bandwidth):
    code, _out, err = run_ftplan([*PLAN, "--gpu", "H200", "--gpus", "16", "--inter-node-bandwidth", bandwidth],
                                 capsys, monkeypatch)
    assert code == 2 and "GB/s" in err and "Traceback" not in err, err


ALIASED = "name,aliases,memory_gib,bf16_dense_tflops,memory_bandwidth_gbs"


def test_a_users_aliases_find_their_card_and_a_replaced_card_keeps_its_shipped_ones(tmp_path):
    path = tmp_path / "specs.csv"
    path.write_text(f"{ALIASED}\nLab-Card,labcard;a100,48,300,900\nh200,,100,989,4800\n")
    catalog = load_catalog(path)
    assert find_gpu("labcard", catalog).name == "Lab-Card"
    assert find_gpu("A100", catalog).name == "Lab-Card"  # the user's alias wins over the shipped one (A100-40GB)
    assert find_gpu("h200-sxm", catalog).memory_gib == 100  # their H200 row, by the shipped row's alias


def test_an_alias_that_is_another_cards_name_is_refused_not_shadowed(tmp_path, capsys, monkeypatch):
    """A user's alias 'H100' for their own card planned for the shipped H100, without a word."""
    path = tmp_path / "specs.csv"
    path.write_text(f"{ALIASED}\nLab-Card,h100,48,300,900\n")
    code, _out, err = run_ftplan([*PLAN, "--gpu", "h100", "--gpu-specs", path], capsys, monkeypatch)
    assert code == 2 and "Lab-Card's alias 'H100' is the name of another card" in err, err


def test_a_plan_for_a_users_own_card_is_emitted_and_rehearsable(tmp_path, capsys, monkeypatch):
    """rehearse checked plan.json's GPU against the shipped catalog alone: a --gpu-specs card's emitted folder
    exited 2 ('unknown GPU') after it was written, and rehearse has no --gpu-specs to pass."""
    path = tmp_path / "specs.csv"
    path.write_text(f"{ALIASED}\nLab-Card,lab,141,989,4800\n")
    folder = tmp_path / "emitted"
    code, _out, err = run_ftplan([*PLAN, "--gpus", "1", "--gpu", "lab", "--gpu-specs", path, "--emit", folder],
                                 capsys, monkeypatch)
    assert code == 0, err
    code, out, err = run_ftplan(["rehearse", folder, "--dry-run"], capsys, monkeypatch)
    assert code == 0 and "Lab-Card" in out, out + err


def test_rows_are_matched_as_names_are_looked_up(tmp_path):
    """'nvidia H100' hid beside the shipped H100 and --gpu H100 took whichever came last; a user's 'CPU' row lost to
    the host's; an alias two rows shared meant the last of them."""
    path = tmp_path / "specs.csv"
    path.write_text(f"{ALIASED}\nnvidia H100,,10,500,2000\nCPU,,1,1,1\n")
    catalog = load_catalog(path)
    assert "H100" not in catalog and find_gpu("H100", catalog).memory_gib == 10
    assert find_gpu("h100-sxm", catalog).memory_gib == 10  # the replaced card's shipped alias
    assert find_gpu("cpu", catalog).memory_gib == 1 and [n for n in catalog if n.lower() == "cpu"] == ["CPU"]
    path.write_text(f"{ALIASED}\nMyCard,foo;bar,48,300,900\nOther,FOO,50,300,900\n")
    with pytest.raises(FtplanError, match="alias 'foo' names both MyCard and Other"):
        load_catalog(path)


def test_a_folder_as_specs_says_so_without_a_descriptor_number(tmp_path, capsys, monkeypatch):
    code, _out, err = run_ftplan(["gpus", "--gpu-specs", tmp_path], capsys, monkeypatch)
    assert code == 2 and err.strip() == f"error: cannot read GPU specs {tmp_path}: Is a directory", err


def test_a_row_without_torch_total_gib_budgets_no_more_than_any_catalog_card_gives_pytorch(tmp_path, capsys,
                                                                                            monkeypatch):
    """The catalog's memory_gib is the datasheet's figure (H100 80, H200 141), of which PyTorch gets 91.6-99.1%;
    a user's row in that convention budgeted the whole figure (a B200 row of 192 planned for 192 GiB, where the
    card gives PyTorch about 179)."""
    shipped = [spec for spec in load_catalog().values() if spec.torch_total_gib]
    least = min(spec.torch_total_gib / spec.memory_gib for spec in shipped)
    with pytest.warns(UserWarning, match="B200 has no torch_total_gib"):
        card = find_gpu("B200", load_catalog(specs(tmp_path, "B200,192,2250,8000,,")))
    assert card.memory_bytes == pytest.approx(192 * least * 2**30, rel=1e-9) and least < 0.95
    measured = find_gpu("B200", load_catalog(specs(tmp_path, "B200,192,2250,8000,,179.1")))
    assert measured.memory_bytes == pytest.approx(179.1 * 2**30)  # a measured figure is taken as it is
    code, out, err = run_ftplan([*PLAN, "--gpu", "B200", "--gpu-specs", specs(tmp_path, "B200,192,2250,8000,,")],
                                capsys, monkeypatch)
    assert code == 0 and "torch.cuda.mem_get_info()" in err and f"{192 * least:.1f} GiB (your GPU specs)" in out, err

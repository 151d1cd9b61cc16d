"""The click options that say what plan, eta, predict and report read: the GPU, the memory budget, the links
and the calibrations, so every command states the same defaults and help."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import click

from ftplan.core.hardware import COLUMNS, OPTIONAL_NUMBER_COLUMNS
from ftplan.models.safe_batch import DEFAULT_CONTEXT_RESERVE_GIB
from ftplan.evidence.inputs import DEFAULT_INTER_NODE_LINK, USER_CALIBRATIONS
from ftplan.planner.search import DEFAULT_SAFETY_MARGIN


class FiniteFloat(click.FloatRange):
    """A real number: click's float takes 'nan' and 'inf', which no option means and the arithmetic cannot use."""

    name = "float"  # `--epochs FLOAT` in help, not FLOAT RANGE

    def _describe_range(self) -> str:
        """No bounds, nothing to say: click would print `[x<=None]`."""
        return "" if self.min is None and self.max is None else super()._describe_range()

    def convert(self, value, param, ctx) -> float:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


FINITE_FLOAT = FiniteFloat()


class Fraction(FiniteFloat):
    """A fraction, as 0.08 or as 8%: the help shows the default as a percentage, and a user types it back so."""

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, str) and value.strip().endswith("%"):
            return super().convert(value.strip()[:-1], param, ctx) / 100
        return super().convert(value, param, ctx)


MAX_CONTEXT_RESERVE_GIB = 1024  # more than any card holds


GPU_SPECS_HELP = (f"CSV of GPU specs overriding or adding cards: columns {', '.join(COLUMNS)} (required), "
                  f"{', '.join(OPTIONAL_NUMBER_COLUMNS)}, aliases, interconnect (optional); see data/gpus.csv.")


def gpu_options(command: Callable) -> Callable:
    """--gpu NAME and --gpu-specs FILE."""
    command = click.option("--gpu-specs", type=click.Path(path_type=Path), default=None,
                           help=GPU_SPECS_HELP)(command)
    return click.option("--gpu", "gpu_name", required=True, help="GPU model, e.g. H200 (see `ftplan gpus`).")(command)


def budget_options(command: Callable) -> Callable:
    """--safety-margin and --context-reserve-gib: the policy that turns capacity into usable memory."""
    command = click.option("--context-reserve-gib", type=FiniteFloat(0, MAX_CONTEXT_RESERVE_GIB),
                           default=DEFAULT_CONTEXT_RESERVE_GIB, show_default=True,
                           help="GiB kept for the CUDA context and NCCL buffers on top of the margin "
                                "(torch's reserved bytes omit them).")(command)
    return click.option("--safety-margin", type=Fraction(), default=None,
                        help="Fraction of capacity kept free (0.08 or 8%), above predicted bounds and measured peaks "
                             "alike.  "
                             f"[default: {DEFAULT_SAFETY_MARGIN:.0%}]")(command)


def link_options(command: Callable) -> Callable:
    """--intra-node-bandwidth and --inter-node-bandwidth: the links the communication model prices."""
    command = click.option("--inter-node-bandwidth", default=None,
                           help="Between nodes, per node: e.g. 600MB/s, 25Gbit/s, 0.6 (GB/s) or a link name "
                                "(cloud, 100gbe, ib-ndr, ...). Default: a measured network calibration, else "
                                f"'{DEFAULT_INTER_NODE_LINK}' (data/networks.csv).")(command)
    return click.option("--intra-node-bandwidth", default=None,
                        help="Between the GPUs of one node, same forms. Default: a measured network calibration, "
                             "else the GPU's interconnect from the catalog.")(command)


def calibrations_option(command: Callable) -> Callable:
    return click.option("--calibrations", multiple=True, type=click.Path(path_type=Path),
                        help="Calibration JSONL file or folder (repeatable); default: the calibrations shipped in "
                             f"data/ plus ./{USER_CALIBRATIONS}/ when it exists.")(command)

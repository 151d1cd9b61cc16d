"""In dataset mode the recommendation's reasons quote the same s/step as the table: the ETA's, timed at the
mean padded length, not the prediction at the longest batch's length (which only sets memory)."""

from __future__ import annotations

import re

from ftplan.planner.advice import reasons
from tests.test_dataset_batching import _plan


def test_switch_reasons_quote_the_tables_step_time_in_dataset_mode():
    result = _plan("dynamic").plan
    rec = result.recommended
    table = f"{rec.eta.seconds_per_step:.2f}"
    assert table != f"{rec.best.seconds_per_step.mean:.2f}"  # the two lengths differ on this long tail
    switches = [line for line in reasons(result) if " s/step" in line]
    assert switches, reasons(result)
    for line in switches:
        ours, theirs = re.findall(r"at ([\d.]+) s/step", line)
        assert ours == table, line
        twin = next(s for s in result.ranked + result.too_slow if f"batch {s.batch} at {theirs} s/step" in line)
        assert theirs == f"{twin.eta.seconds_per_step:.2f}"

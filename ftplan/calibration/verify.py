"""The verify step: after a few small batches, run the batch the planner would recommend.

Three small batches fix the lines of the phases they sit in, but not where a phase they never
reached takes over (full fine-tuning with checkpointing and Liger is flat from batch 1 to 4 and
steep from ~16). One trial at the recommended batch either proves it (measured healthy) or runs out
of memory, which bounds every later plan below it; the planner is asked again after each outcome.
A few such trials give a safe, near-exact answer where a full ladder takes ten or more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

OK, OOM = "ok", "oom"
MAX_VERIFY_TRIALS = 3


def next_verify_batch(outcomes: Mapping[int, str], planned: int, roomier: Callable[[int], bool],
                      trials_done: int) -> int | None:
    """The next batch to verify, or None when the plan stands.

    planned: the largest safe batch the planner gives for everything measured so far.
    roomier(b): whether batch b's mean prediction fits although its bound does not (a loose bound),
    which makes b worth one trial. After an OOM the next trial bisects between the largest batch that
    ran and the OOM; batches at or above a known OOM are never run again.
    """
    if trials_done >= MAX_VERIFY_TRIALS or planned < 1:
        return None
    first_oom = min((b for b, s in outcomes.items() if s == OOM), default=None)
    if first_oom is not None:  # a batch ran out of memory: bisect towards the largest that ran
        largest_ok = max((b for b, s in outcomes.items() if s == OK and b < first_oom), default=0)
        planned = min(planned, (largest_ok + first_oom) // 2)
    candidates = [planned] if planned not in outcomes else [planned + 1] if roomier(planned + 1) else []
    for batch in candidates:
        if batch not in outcomes and (first_oom is None or batch < first_oom):
            return batch
    return None

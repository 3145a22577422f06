"""Garbage-collector settings for a long-running server process."""

from __future__ import annotations

import gc


def tune(gen0_threshold: int) -> None:
    """Freeze what startup allocated and collect the young generation less often.

    CPython's default (a gen-0 pass every 700 net allocations) makes a busy proxy walk its
    in-flight requests' objects over and over and promote them to older generations, whose
    passes then walk them again; that work grows with concurrency. Refcounting frees almost
    everything a request allocates, so rarer passes only delay freeing reference cycles.
    `gen0_threshold` 0 keeps the interpreter's defaults.
    """
    if gen0_threshold <= 0:
        return
    gc.collect()
    # Config, routing tables, modules: live for the whole process, never worth scanning again.
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)

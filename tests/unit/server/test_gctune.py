"""GC tuning of the server process: freeze startup objects, rarer young-generation passes."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from router.server.gctune import tune


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tune_freezes_startup_objects_and_raises_gen0(restore_gc: None) -> None:
    _, gen1, gen2 = gc.get_threshold()
    survivor = [object() for _ in range(10)]
    tune(50_000)
    assert gc.get_threshold() == (50_000, gen1, gen2)
    assert gc.get_freeze_count() > len(survivor)


def test_zero_keeps_the_interpreter_defaults(restore_gc: None) -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    tune(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen

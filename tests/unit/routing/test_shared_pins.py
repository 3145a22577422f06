"""routing.shared_pins: the workers' table of which region holds each stored response."""

from __future__ import annotations

from pathlib import Path

from router.routing import shared_pins
from router.routing.shared_pins import SLOT_BYTES, SharedPins


def test_one_workers_note_is_read_by_another(tmp_path: Path) -> None:
    path = str(tmp_path / "pins.table")
    shared_pins.create(path, 64)
    one, two = SharedPins(path, ["a", "b"]), SharedPins(path, ["a", "b"])
    try:
        one.record("resp_1", "b", "t1")
        assert two.home("resp_1", "t1") == ("b", True)
        assert two.home("resp_1", "t2") == ("b", False)  # another tenant's
        assert two.home("resp_2", "t1") is None
        one.record("resp_1", "a", "t1")  # the same id again: its note is replaced
        assert two.home("resp_1", "t1") == ("a", True)
        one.record("resp_3", "nowhere", "t1")  # not a configured region: not noted
        assert two.home("resp_3", "t1") is None
    finally:
        one.close()
        two.close()


def test_a_torn_slot_reads_as_empty_and_a_full_table_forgets(tmp_path: Path) -> None:
    path = str(tmp_path / "pins.table")
    shared_pins.create(path, 8)
    pins = SharedPins(path, ["a"])
    try:
        pins.record("resp_1", "a", "t")
        offset = next(
            i * SLOT_BYTES
            for i in range(8)
            if any(pins._map[i * SLOT_BYTES : (i + 1) * SLOT_BYTES])
        )
        pins._map[offset + 20] ^= 0xFF  # half-written by another worker
        assert pins.home("resp_1", "t") is None
        for i in range(100):
            pins.record(f"resp_{i}", "a", "t")
        found = sum(pins.home(f"resp_{i}", "t") is not None for i in range(100))
        assert 0 < found <= 8
    finally:
        pins.close()


def test_a_tenant_filling_the_table_mostly_replaces_its_own_notes(tmp_path: Path) -> None:
    path = str(tmp_path / "pins.table")
    shared_pins.create(path, 256)
    pins = SharedPins(path, ["a"])
    try:
        quiet = [f"quiet_{i}" for i in range(16)]
        for rid in quiet:
            pins.record(rid, "a", "quiet")
        kept = sum(pins.home(rid, "quiet") is not None for rid in quiet)
        for i in range(5000):
            pins.record(f"busy_{i}", "a", "busy")
        # Over the first of the 4 only when none of them is empty or the writer's own: the
        # busy tenant's notes take the free slots, then replace each other.
        after = sum(pins.home(rid, "quiet") is not None for rid in quiet)
        assert after == kept == len(quiet)
    finally:
        pins.close()

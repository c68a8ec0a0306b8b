"""in_slices: a flush takes what it counted, a slice at a time, and stops when another took the rest."""

from __future__ import annotations

from pathprobe.loadgen.slices import in_slices


def _queue(items: list[int], got: list[int]):
    def take(n: int) -> int:
        part = items[:n]
        del items[:n]
        got.extend(part)
        return len(part)

    return take


def test_takes_what_it_counted_in_slices_and_leaves_later_items() -> None:
    items, got, pauses = list(range(40)), [], []
    taken = in_slices(_queue(items, got), 35, 16, lambda: pauses.append(len(got)))
    assert taken == 35 and got == list(range(35)) and items == list(range(35, 40))
    assert pauses == [16, 32, 35]


def test_stops_when_an_overlapping_flush_took_the_rest() -> None:
    items, got, other = list(range(40)), [], []
    other_take = _queue(items, other)
    # the pause after the first slice is where another flush runs: it takes everything left
    taken = in_slices(_queue(items, got), 40, 16, lambda: other_take(len(items)))
    assert taken == 16 and got == list(range(16)) and other == list(range(16, 40)) and items == []


def test_nothing_to_take() -> None:
    assert in_slices(_queue([], []), 0, 16) == 0
    assert in_slices(_queue([], []), 5, 16) == 0

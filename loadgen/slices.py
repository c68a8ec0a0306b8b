"""Work through a queue in slices, with the event loop running between them.

The load generator's flushes (records into histograms and files, finished spans to their
exporter) take a queue's items a slice at a time and pause between slices, so no flush holds the
loop while a response waits to be timed. Two flushes may overlap (a user's, the periodic one, the
test's end): each takes only what is still there, and one whose items another took stops instead
of waiting for items that will never come.
"""

from __future__ import annotations

from collections.abc import Callable


def in_slices(take: Callable[[int], int], left: int, size: int, pause: Callable[[], None] | None = None) -> int:
    """Call ``take(n)`` (takes up to ``n`` items off the queue, returns how many it took) until
    ``left`` items are taken or the queue is empty; ``pause`` runs after each slice. Returns how
    many were taken."""
    taken = 0
    while taken < left:
        n = take(min(size, left - taken))
        if n <= 0:  # an overlapping flush took the rest
            break
        taken += n
        if pause is not None:
            pause()
    return taken

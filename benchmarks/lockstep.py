"""What the side-by-side training benchmarks share: two trainings in lockstep, one thread each, taking one step each
in turn (`Baton`, `lockstep`), and the spread of a list of step times (`relative_iqr`).

Lockstep interleaving times step k of one side right next to step k of the other, under the same machine conditions:
a busy moment of a shared machine slows both, not one. The side in `lockstep`'s own thread is trainforge's, which
installs signal handlers (only the main thread may); the other side runs in a second thread, started once the first
has reached its first training forward (one setup at a time), so it may read what the first side's probe recorded
there (its RNG state, its initial weights). A side waits for its turn at the start of each training forward; the
wait is outside both clocks (a blocked thread uses no CPU time, and the wall stamps bracket it).
"""
from __future__ import annotations

import statistics
import threading
from typing import Any, Callable


class Baton:
    """The turn of one of two `sides` (names); `first` goes first."""

    def __init__(self, first: str, sides: tuple[str, str]) -> None:
        assert first in sides
        self.sides = sides
        self.cond = threading.Condition()
        self.turn, self.arrived, self.done = first, set(), set()

    def other(self, side: str) -> str:
        return self.sides[1 - self.sides.index(side)]

    def _mine(self, side: str) -> bool:
        return self.turn == side or self.other(side) in self.done

    def arrive(self, side: str) -> None:
        """First training forward: wait until the other side has got there too (or has ended), then our turn."""
        with self.cond:
            self.arrived.add(side)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.other(side) in self.arrived | self.done and self._mine(side))

    def wait_arrived(self, side: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: side in self.arrived | self.done)

    def hand_over(self, side: str) -> None:
        """One step done: the other side's turn; returns when it is ours again (or the other side has ended)."""
        with self.cond:
            self.turn = self.other(side)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self._mine(side))

    def finish(self, side: str) -> None:
        with self.cond:
            self.done.add(side)
            self.turn = self.other(side)
            self.cond.notify_all()


def lockstep(baton: Baton, main_side: Callable[[], Any], second_side: Callable[[], Any]) -> tuple[Any, Any]:
    """(main_side(), second_side()) run under `baton`: the first in this thread, the second in a new one started once
    the first side (baton.sides[0]) has reached its first training forward. An error on either side ends the other's
    wait and is raised here."""
    first, second = baton.sides
    box: dict[str, Any] = {}

    def second_thread() -> None:
        try:
            baton.wait_arrived(first)
            box["result"] = second_side()
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            box["error"] = e
        finally:
            baton.finish(second)

    thread = threading.Thread(target=second_thread, name=second, daemon=True)
    thread.start()
    try:
        result = main_side()
    finally:
        baton.finish(first)
        thread.join()
    if "error" in box:
        raise box["error"]
    return result, box["result"]


def relative_iqr(values: list[float]) -> float:
    """(q3 - q1) / median: the spread of step times, in parts of the median (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)

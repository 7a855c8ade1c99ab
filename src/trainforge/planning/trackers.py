"""torch's memory trackers, keeping the peak of the whole step only: what `planning.simulate` runs a step under.

Their own module because importing torch's trackers costs about 1.1 s (DTensor's sharding rules come with them):
`simulate` imports this where a simulation starts, so a training run that asks the planner nothing never pays it.
"""
from __future__ import annotations

from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker


class _GlobalPeakOnly:
    """torch's trackers, keeping the peak of the whole step only.

    After every op MemTracker also updates each module's own peak by walking every module it has seen (a
    weak-keyed dictionary, ~1,000 entries for a 32-layer transformer): ~60% of the time of simulating an 8B
    model, for module-wise statistics the planner never reads. This override keeps the rest of
    `_update_peak_stats` as it is: the global peak and its breakdown (`get_tracker_snapshot("peak")`) are
    the same numbers; `display_modulewise_snapshots` is what is given up.
    """

    _curr_mem_snap: dict
    _peak_mem: dict
    _peak_mem_snap: dict

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)  # category -> bytes: a flat copy is a deep one

    def reset_peak(self) -> None:
        """Track the peak from now on, as entering the tracker starts it."""
        self._peak_mem_snap = {dev: dict(snap) for dev, snap in self._curr_mem_snap.items()}
        self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in self._peak_mem_snap.items()}


class PeakMemTracker(_GlobalPeakOnly, MemTracker):
    """MemTracker with the global peak only (`_GlobalPeakOnly`)."""


class PeakFSDPMemTracker(_GlobalPeakOnly, FSDPMemTracker):
    """FSDPMemTracker with the global peak only (`_GlobalPeakOnly`)."""

"""Slot lists from --gpus: CPU slots with a declared memory, GPU indices, auto detection."""
from __future__ import annotations

import pytest

from trainforge.errors import UserError
from trainforge.jobs import slots as slots_mod
from trainforge.jobs.slots import GiB, parse_slots

FAKE_GPUS = {0: ("NVIDIA H100 80GB HBM3", 80 * GiB), 1: ("NVIDIA H100 80GB HBM3", 80 * GiB)}


def test_cpu_slots_declare_their_memory():
    slots = parse_slots("cpu:4", 4)
    assert [s.id for s in slots] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert all(s.kind == "cpu" and s.memory_bytes == 4 * GiB for s in slots)


def test_cpu_slots_default_to_a_share_of_available_memory(monkeypatch):
    monkeypatch.setattr("trainforge.planning.local.available_memory_bytes", lambda: 12 * GiB)
    assert [s.memory_bytes for s in parse_slots("cpu:3")] == [4 * GiB] * 3


def test_gpu_indices_offer_90_percent(monkeypatch):
    monkeypatch.setattr(slots_mod, "detect_gpus", lambda: FAKE_GPUS)
    slots = parse_slots("1")
    assert [(s.id, s.index, s.kind) for s in slots] == [("1", 1, "gpu")]
    assert slots[0].memory_bytes == int(80 * GiB * 0.9) and slots[0].total_bytes == 80 * GiB
    assert [s.id for s in parse_slots("auto")] == ["0", "1"]


def test_auto_without_gpus_is_one_cpu_slot(monkeypatch):
    monkeypatch.setattr(slots_mod, "detect_gpus", lambda: {})
    assert [(s.id, s.memory_bytes) for s in parse_slots("auto", 2)] == [("cpu0", 2 * GiB)]


@pytest.mark.parametrize("spec, memory, message", [
    ("cpu:0", None, "cpu:N with N >= 1"),
    ("cpu:x", None, "cpu:N"),
    ("0,0", None, "distinct GPU indices"),
    ("a,b", None, "expected auto, GPU indices"),
    ("5", None, "GPU 5 not found"),
    ("cpu:2", -1.0, "--slot-memory-gb"),
    ("gpu:0", 80.0, "gpu:N with N >= 1"),
    ("gpu:2", None, "--slot-memory-gb"),
])
def test_bad_gpu_specs_name_the_flag(monkeypatch, spec, memory, message):
    monkeypatch.setattr(slots_mod, "detect_gpus", lambda: FAKE_GPUS)
    with pytest.raises(UserError, match=message) as e:
        parse_slots(spec, memory)
    assert str(e.value).startswith("--")


def test_a_cluster_nodes_gpus_are_declared_not_detected(monkeypatch):
    monkeypatch.setattr(slots_mod, "detect_gpus", lambda: {})  # none on this machine: the node's are described
    slots = parse_slots("gpu:4", 80.0)
    assert [(s.id, s.kind, s.index, s.memory_bytes) for s in slots] == [(str(i), "gpu", i, 80 * 2**30) for i in range(4)]

"""The typed planner result: `Plan.to_json()` is exactly the `plan --json` document (the contract's names plus
the existing extras, in their order), consumers read attributes, and each candidate step is a pure function."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from rich.console import Console

import trainforge
from trainforge.hardware.catalog import Catalog, Price, load_catalog
from trainforge.planning.memory import SimCache
from trainforge.planning.plan import (MemoryRule, fit_memory, plan, plan_local_step, price_run, rank_key,
                                      recommend)
from trainforge.planning.render import render_plan
from trainforge.planning.result import Candidate, Plan

# the contract of `plan --json` (docs/architecture.md, "Contracts")
DESIGN_SIMULATION = {"peak_bytes", "breakdown", "model_flops_per_step", "hardware_flops_per_step",
                     "samples_per_step", "tokens_per_step"}
DESIGN_CANDIDATE = {"gpu", "num_gpus", "strategy", "micro_batch_size", "accumulation", "fits", "peak_bytes_per_gpu",
                    "step_time_s", "total_time_s", "cost_usd", "energy_kwh"}
# the document as it was before the typed result, key for key and in order
TOP = ["recipe", "steps", "global_batch_size", "simulation", "candidates", "recommendation"]
SIMULATION = ["micro_batch_size", "precision", "peak_bytes", "breakdown", "param_count", "model_flops_per_step",
              "hardware_flops_per_step", "samples_per_step", "tokens_per_step", "accumulation", "simulations_run"]
FITTING = ["gpu", "num_gpus", "precision", "method", "fits", "strategy", "activation_checkpointing", "micro_batch_size",
           "accumulation", "peak_bytes_per_gpu", "simulated_peak_bytes_per_gpu", "corrections_bytes", "memory_bytes",
           "step_time_s", "step_time_range_s", "calibrated_time_factor", "bound", "exposed_comm_s", "efficiency",
           "efficiency_range", "efficiency_source", "total_time_s", "cost_usd", "energy_kwh", "price_usd_per_hour",
           "price_source", "within_budget", "within_deadline"]
NOT_FITTING = ["gpu", "num_gpus", "precision", "method", "fits", "reason"]
PICK = ["gpu", "num_gpus", "method", "strategy", "micro_batch_size", "accumulation", "total_time_s", "cost_usd"]


def tiny_catalog() -> Catalog:
    """The built-in catalog plus a 2 MiB GPU nothing fits on."""
    cat = load_catalog()
    gpus = dict(cat.gpus)
    gpus["tiny"] = dataclasses.replace(cat.get("h100-sxm"), name="tiny", aliases=(), memory_bytes=2 * 2**20)
    return Catalog(gpus, cat.prices)


@pytest.fixture(scope="module")
def digits() -> Plan:
    cfg = trainforge.load_config("digits_cnn")
    return plan(cfg, gpus=["h100-sxm", "t4", "tiny", "cpu"], num_gpus=[1, 2, 3], budget_usd=1.0, deadline_h=1.0,
                catalog=tiny_catalog(), calibration={"t4": {"time_factor": 2.0}})


def test_json_keys_are_the_contract_plus_the_existing_extras_in_order(digits):
    doc = digits.to_json()
    assert list(doc) == TOP
    assert list(doc["simulation"]) == SIMULATION and DESIGN_SIMULATION <= set(SIMULATION)
    assert DESIGN_CANDIDATE <= set(FITTING)
    kinds = {"fits": 0, "does not divide": 0, "no memory": 0}
    for row in doc["candidates"]:
        if row["fits"]:
            assert list(row) == FITTING
            kinds["fits"] += 1
        else:
            assert list(row) == NOT_FITTING
            kinds["does not divide" if "does not divide" in row["reason"] else "no memory"] += 1
    assert all(kinds.values()), kinds  # every shape of candidate is covered
    assert list(doc["recommendation"]) == ["fastest", "cheapest", "recommended"]
    for pick in doc["recommendation"].values():
        assert list(pick) == PICK


def test_json_is_plain_json_and_the_values_are_the_attributes(digits):
    doc = digits.to_json()
    assert json.loads(json.dumps(doc)) == doc  # lists, not tuples; nothing that is not JSON
    assert doc["steps"] == digits.steps and doc["simulation"]["peak_bytes"] == digits.simulation.peak_bytes
    for c, row in zip(digits.candidates, doc["candidates"]):
        for key, value in row.items():
            attr = getattr(c, key)
            assert (list(attr) if isinstance(attr, tuple) else attr) == value, key
    t4 = next(c for c in digits.candidates if c.gpu == "t4" and c.num_gpus == 1)
    assert t4.precision == "fp16" and t4.calibrated_time_factor == 2.0
    assert t4.step_time_range_s[0] <= t4.step_time_s <= t4.step_time_range_s[1]


def test_candidates_are_ranked_and_the_recommendation_names_candidates(digits):
    assert list(digits.candidates) == sorted(digits.candidates, key=rank_key)
    rec = digits.recommendation
    assert rec.recommended is rec.cheapest and rec.recommended in digits.candidates and rec.reason is None
    assert rec.fastest.total_time_s == min(c.total_time_s for c in digits.candidates if c.fits)
    assert digits.to_json()["recommendation"]["fastest"] == rec.fastest.pick()


def test_recommend_says_why_there_is_none():
    row = dict(gpu="x", num_gpus=1, precision="bf16", fits=True, strategy="none", micro_batch_size=1,
               accumulation=1, total_time_s=10.0, cost_usd=2.0)
    over = Candidate(**row, within_budget=False)
    assert "budget" in recommend([over], 1.0, None).reason
    assert "fits in memory" in recommend([Candidate("x", 1, "bf16", fits=False, reason="r")], None, None).reason
    assert recommend([over, Candidate(**{**row, "cost_usd": 1.0})], None, None).recommended.cost_usd == 1.0
    assert recommend([over], 1.0, None).to_json() == {"fastest": over.pick(), "cheapest": over.pick(),
                                                      "recommended": None, "reason": recommend([over], 1, None).reason}


def test_price_run_is_the_cost_and_energy_arithmetic():
    price = Price("h100-sxm", 2.0, "acme", "on-demand", "2026-01", "test")
    cost = price_run(0.5, steps=7200, num_gpus=4, tdp_watts=700.0, price=price, budget_usd=10.0, deadline_h=0.5)
    assert cost.total_time_s == 3600.0 and cost.cost_usd == pytest.approx(8.0)
    assert cost.energy_kwh == pytest.approx(2.8) and cost.within_budget is True and cost.within_deadline is False
    assert cost.price_source == "acme on-demand 2026-01"
    free = price_run(0.5, steps=10, num_gpus=1, tdp_watts=65.0, price=None, budget_usd=1.0, deadline_h=None)
    assert free.cost_usd is None and free.within_budget is None and free.within_deadline is None


def test_fit_memory_gives_the_reason_without_simulating_what_cannot_fit():
    from trainforge.planning.plan import ModelFacts

    def never(key, b):
        raise AssertionError("simulated")

    facts = ModelFacts("other", False, param_count=10**9, state_bytes_per_param=16)
    reason = fit_memory(1, 8, SimCache(never), facts, MemoryRule(2**30, (), None), "bf16")
    assert reason == "needs 14.9 GiB per GPU even at micro-batch 1 with every strategy; 1.0 GiB usable"


def test_render_reads_the_plan(digits):
    console = Console(record=True, width=200)
    for renderable in render_plan(digits):
        console.print(renderable)
    text = console.export_text()
    assert "does not divide" in text and "recommended" in text and "h100-sxm" in text


def test_local_step_is_a_candidate_and_the_api_returns_the_json():
    cfg = trainforge.load_config(None, ["model.args={channels: [8, 16]}"])
    local = plan_local_step(cfg, torch.device("cpu"), load_catalog(), micro_batch_size=16, precision="fp32", calibration={})
    assert isinstance(local, Candidate) and local.fits and local.gpu == "cpu" and local.micro_batch_size == 16
    doc = trainforge.plan(cfg, gpus=["h100-sxm"], num_gpus=[1], calibration={})
    assert isinstance(doc, dict) and list(doc) == TOP and list(doc["candidates"][0]) == FITTING

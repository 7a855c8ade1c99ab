"""A job's run directory is the job's to write, and its code may be hostile (issue 50, High 2 and Medium 8): a
metrics.jsonl made a FIFO or a link to /dev/zero must not hang the server, exhaust its memory or outlive a restart,
and a huge metrics.jsonl must cost a poll only what is new. The files are made in the run directories of real jobs
of a real `trainforge server` process, as a job's own code would make them there."""
from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest

from jobs_helpers import CLIENT, ServerProcess, wait_for

QUICK = ["train.max_steps=20", "train.eval_every_steps=10", "train.checkpoint_every_steps=1000",
         "train.log_every_steps=1", "log.progress=false", "log.tensorboard=false", "log.report=false",
         "data.num_workers=0", "train.early_stopping=null"]


def timed_get(url: str) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    r = httpx.get(url, timeout=5, headers=CLIENT)
    return r, time.monotonic() - start


def answers_within_a_second(server: ServerProcess, ids: list[int]) -> dict[int, dict]:
    """Every page and API read that looks at the jobs' run directories, each timed; the listing by id."""
    paths = ["/api/jobs", "/api/health", "/", *(f"/api/jobs/{i}" for i in ids), *(f"/api/jobs/{i}/metrics" for i in ids),
             *(f"/jobs/{i}" for i in ids), *(f"/api/jobs/{i}/val_images.png" for i in ids)]
    for path in paths:
        r, took_s = timed_get(server.url + path)
        assert r.status_code in (200, 404), (path, r.status_code, r.text[:300])
        assert took_s < 1.0, f"{path} took {took_s:.2f} s"
    return {job["id"]: job for job in httpx.get(server.url + "/api/jobs", timeout=5).json()}


@pytest.mark.serial  # a timing bar (1 s an answer): measured with the machine to itself
def test_a_fifo_or_a_device_link_as_metrics_hangs_nothing_and_shows_unreadable(tmp_path):
    """Two jobs run; then, as their own code could have done, one's metrics.jsonl becomes a FIFO and the other's a
    link to /dev/zero (measured once they have ended: the timings are the server's, not two trainers' load)."""
    from trainforge.jobs.runner import job_processes

    data_root = tmp_path / "data"
    data_root.mkdir()
    state = tmp_path / "state"
    with ServerProcess(tmp_path, data_root, gpus="cpu:2", state=state) as server:
        ids = [server.submit("digits_cnn", *QUICK).json()["id"] for _ in range(2)]
        runs = {i: state / "jobs" / str(i) / "run" for i in ids}
        wait_for(lambda: all((runs[i] / "eval.json").is_file() and not job_processes(runs[i]) for i in ids), 180,
                 "both jobs to finish", 0.2)
        fifo, device = (runs[i] / "metrics.jsonl" for i in ids)
        fifo.unlink()
        os.mkfifo(fifo)
        device.unlink()
        device.symlink_to("/dev/zero")

        for _ in range(3):
            jobs = answers_within_a_second(server, ids)
        for _ in range(60):  # more listings than the server has threads: none is left blocked on a job's file
            r, took_s = timed_get(server.url + "/api/jobs")
            assert r.status_code == 200 and took_s < 1.0, took_s
        assert "a FIFO, not a regular file" in jobs[ids[0]]["progress"]["unreadable"]
        assert "a link, not a regular file" in jobs[ids[1]]["progress"]["unreadable"]
        assert [jobs[i]["state"] for i in ids] == ["succeeded", "succeeded"]
        metrics = httpx.get(f"{server.url}/api/jobs/{ids[0]}/metrics", timeout=5).json()
        assert metrics["train"] == [] and "FIFO" in metrics["unreadable"]
        assert server.stop(timeout_s=20), "SIGTERM did not stop the server"

    with ServerProcess(tmp_path, data_root, gpus="cpu:2", state=state) as server:  # restarted on the same state
        jobs = answers_within_a_second(server, ids)
        assert "FIFO" in jobs[ids[0]]["progress"]["unreadable"]
        assert "link" in jobs[ids[1]]["progress"]["unreadable"]
        assert server.stop(timeout_s=20), "SIGTERM did not stop the restarted server"
    assert "Traceback" not in server.log.read_text()


def _write_rows(path: Path, first_step: int, target_bytes: int) -> int:
    """Rows as the trainer writes them, until the file holds `target_bytes`: the next step."""
    step = first_step
    with open(path, "a") as f:
        while f.tell() < target_bytes:
            f.write("".join(
                f'{{"split": "train", "step": {s}, "epoch": 0, "loss": {1 / s:.6f}, "lr": 0.001, "samples_per_s": 812.5, '
                f'"step_time_s": 0.0123, "data_wait_frac": 0.01, "peak_mem_bytes": 123456789, "grad_norm": 1.25}}\n'
                + (f'{{"split": "val", "step": {s}, "epoch": 0, "loss": {1 / s:.6f}, "accuracy": 0.5}}\n'
                   if s % 1000 == 0 else "")
                for s in range(step, step + 10000)))
            step += 10000
    return step


@pytest.mark.serial  # a timing bar (50 ms a poll): measured with the machine to itself
def test_a_huge_metrics_file_costs_a_poll_only_what_is_new(tmp_path):
    from trainforge.jobs.progress import MAX_POINTS, series

    metrics = tmp_path / "metrics.jsonl"
    step = _write_rows(metrics, 1, 200 << 20)
    first = series(tmp_path)
    assert first["train"][0]["step"] == 1 and first["train"][-1]["step"] == step - 1
    for split, newest in (("train", step - 1), ("val", (step - 1) // 1000 * 1000)):  # thinned, the newest kept
        assert MAX_POINTS // 2 <= len(first[split]) <= MAX_POINTS + 1 and first[split][-1]["step"] == newest
    for traced in (False, True, False, True):  # the run goes on: each poll reads the rows written since the last
        step = _write_rows(metrics, step, metrics.stat().st_size + 200_000)  # ~1,300 rows, a few seconds of a run
        if traced:  # its memory (tracemalloc slows the poll: timed on the others)
            tracemalloc.start()
        start = time.perf_counter()
        polled = series(tmp_path)
        took_s = time.perf_counter() - start
        if traced:
            _, peak_bytes = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert peak_bytes < 50 << 20, f"a poll allocated {peak_bytes >> 20} MiB"
        else:
            assert took_s < 0.05, f"a poll took {took_s * 1000:.0f} ms"
        assert polled["train"][-1]["step"] == step - 1  # the newest row is shown
        assert len(polled["train"]) <= MAX_POINTS + 1
    metrics.write_text('{"split": "train", "step": 1, "loss": 2.0}\n')  # replaced (a restarted run): read anew
    assert [p["step"] for p in series(tmp_path)["train"]] == [1]


def test_a_task_registered_after_import_is_charted_on_the_job_page(tmp_path):
    """Issue 51, item 3: the dashboard's chart list is read from the registry when a page asks, so a task a plug-in
    module registers after trainforge was imported is charted (the page draws the first of `charts` its rows have)."""
    from trainforge.jobs.progress import chart_metrics, series
    from trainforge.tasks import TASKS, register_task
    from trainforge.tasks.classification import Classification

    class Widgets(Classification):
        name = "widget_sorting"
        title = "widget sorting"
        description = "test only"
        chart_metrics = ("widgetness",)

    assert "widgetness" not in chart_metrics()
    register_task(Widgets)
    try:
        (tmp_path / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 1.0}\n'
                                                '{"split": "val", "step": 1, "loss": 0.9, "widgetness": 0.25}\n')
        assert "widgetness" in chart_metrics() and chart_metrics()[:3] == ["accuracy", "macro_f1", "perplexity"]
        assert series(tmp_path)["val"] == [{"step": 1, "loss": 0.9, "widgetness": 0.25}]
    finally:
        TASKS._entries.pop(Widgets.name)  # the other tests of this process see the shipped tasks only

"""The job queue on a real Slurm (`trainforge server --backend slurm`), against the slurmctld and the two slurmd the
`slurm_cluster` fixture starts on localhost: a two-process CPU job to success, a cancel, a step killed with
`scancel --signal=KILL` that the server restarts and that resumes bit-identically, two jobs whose planned memory does
not fit one node together run one after the other, and a controller that is down keeps jobs queued until it is back.
Every test here carries `slurm` in its name: `pytest tests/jobs -k slurm` selects them."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs_helpers import (CHROMIUM_MISSING, LiveServer, latest_checkpoint_step, make_service, metrics_rows, wait_for,
                          with_steps)
from trainforge.errors import UserError
from trainforge.jobs import runner
from trainforge.jobs.cluster import PROCESS_BASE_BYTES, check_backend
from trainforge.jobs.service import Submission
from trainforge.jobs.slurm import Slurm, SlurmSettings
from trainforge.layout import FINAL, WEIGHTS

pytestmark = pytest.mark.slow
JOB_TIMEOUT_S = 300


@pytest.fixture
def slurm_service(slurm_cluster, tmp_path):
    services = []

    def make(partition: str = "debug", slots: str = "cpu:2", slot_memory_gb: float = 1.0, name: str = "a"):
        engine = Slurm(SlurmSettings(partition=partition), env=slurm_cluster.env)
        (tmp_path / name).mkdir()
        svc = make_service(tmp_path / name, slots, slot_memory_gb, engine=engine, engine_poll_s=0.3)
        svc.start()
        services.append(svc)
        return svc

    yield make
    for svc in services:
        svc.stop()
        for job in svc.store.list():
            if job.backend_id:
                slurm_cluster.run("scancel", job.backend_id)
        svc.store.close()


def _submit(svc, steps: int, *extra: str, gpus: int = 1, max_restarts: int = 0):
    return svc.enqueue(Submission(recipe="digits_cnn", overrides=(*with_steps(steps), *extra), num_gpus=gpus,
                                 max_restarts=max_restarts))


def _wait_state(svc, job_id: int, states: tuple[str, ...], timeout_s: float = JOB_TIMEOUT_S):
    def reached():
        job = svc.get(job_id)
        return job if job.state in states else None

    try:
        job = wait_for(reached, timeout_s, f"job {job_id} to be {' or '.join(states)}", interval_s=0.2)
    except AssertionError:
        raise AssertionError(_story(svc, job_id)) from None
    if job.state == "failed" and "failed" not in states[:1]:  # an unexpected failure: say why, with its log
        raise AssertionError(_story(svc, job_id))
    return job


def _story(svc, job_id: int) -> str:
    job = svc.get(job_id)
    log = Path(job.log_path).read_text(errors="replace")[-6000:] if Path(job.log_path).exists() else ""
    return f"job {job_id} is {job.state} ({job.reason})\n{log}"


def test_slurm_runs_a_two_process_cpu_job_to_success(slurm_service, slurm_cluster):
    svc = slurm_service()
    job = _submit(svc, 20, gpus=2)
    assert svc.get(job.id).state == "queued"
    done = _wait_state(svc, job.id, ("succeeded", "failed", "cancelled"))
    assert done.state == "succeeded", done.reason
    assert done.backend_id and done.slots and set(done.slots) <= {"tf1", "tf2"}
    fields = slurm_cluster.job_fields(done.backend_id)
    assert fields["JobState"] == "COMPLETED" and fields["Partition"] == "debug"
    assert fields["NumCPUs"] == "2"  # two CPU processes, one CPU each, no GRES
    run = Path(done.run_dir)
    ran = json.loads((run / FINAL / "model.json").read_text())["ran"]
    assert ran["world_size"] == 2 and ran["device"] == "cpu"
    assert max(r["step"] for r in metrics_rows(run)) == 20
    view = svc.view(done)
    assert view["backend"] == "slurm" and view["backend_id"] == done.backend_id
    assert view["progress"]["step"] == 20
    log = Path(done.log_path).read_text()
    assert f"submitted to slurm as job {done.backend_id}" in log and "run completed" in log
    # the unfenced batch script writes the recipe into the job's folder, never into the run directory the job writes
    assert (run.parent / "job-config.yaml").is_file() and not (run / "job-config.yaml").exists()


def test_slurm_cancel_stops_a_running_job(slurm_service, slurm_cluster):
    svc = slurm_service()
    job = _submit(svc, 5000)
    _wait_state(svc, job.id, ("running",))
    wait_for(lambda: metrics_rows(Path(job.run_dir)), 120, "the job's first logged step")
    svc.cancel(job.id)
    done = _wait_state(svc, job.id, ("cancelled", "succeeded", "failed"), timeout_s=120)
    assert done.state == "cancelled", done.reason
    assert slurm_cluster.job_fields(done.backend_id)["JobState"] == "CANCELLED"
    assert runner.job_processes(Path(done.run_dir)) == []
    assert max(r["step"] for r in metrics_rows(Path(done.run_dir))) < 5000


def test_slurm_kill_of_the_step_requeues_and_resumes_bit_identically(slurm_service, slurm_cluster):
    svc = slurm_service()
    steps = 24
    killed = _submit(svc, steps, max_restarts=1)
    reference = _submit(svc, steps, "name=reference")  # the same recipe, never interrupted
    first = _wait_state(svc, killed.id, ("running",))
    wait_for(lambda: latest_checkpoint_step(Path(killed.run_dir)) >= 8, 180, "a checkpoint at step 8 or later")
    kill = slurm_cluster.run("scancel", "--signal=KILL", f"{first.backend_id}.0")
    assert kill.returncode == 0, kill.stderr
    done = _wait_state(svc, killed.id, ("succeeded", "failed", "cancelled"))
    assert done.state == "succeeded", done.reason
    assert done.restarts == 1 and done.backend_id != first.backend_id  # a second Slurm job, with --resume auto
    assert slurm_cluster.job_fields(first.backend_id)["JobState"] == "FAILED"
    log = Path(done.log_path).read_text()
    assert "killed by SIGKILL" in log and "--resume auto" in log
    ref = _wait_state(svc, reference.id, ("succeeded", "failed", "cancelled"))
    assert ref.state == "succeeded", ref.reason
    a = (Path(done.run_dir) / FINAL / WEIGHTS).read_bytes()
    b = (Path(ref.run_dir) / FINAL / WEIGHTS).read_bytes()
    assert a == b, "the resumed run's weights differ from the uninterrupted run's"

    def losses(run_dir):
        return {r["step"]: r["loss"] for r in metrics_rows(Path(run_dir)) if r.get("split") == "train"}

    assert losses(done.run_dir) == losses(ref.run_dir)
    assert json.loads((Path(done.run_dir) / "eval.json").read_text()) == json.loads((Path(ref.run_dir) / "eval.json").read_text())


def test_slurm_queues_jobs_whose_planned_memory_does_not_fit_together(slurm_service, slurm_cluster):
    """Node tf1 (partition `one`) has 3000 MB and 4 CPUs. A two-process job asks Slurm for twice (its planned peak +
    the process base): two of them need more than 3000 MB, but only 4 CPUs, so memory alone keeps the second waiting.
    Two one-process jobs, which fit together, run side by side on the same node."""
    svc = slurm_service(partition="one")
    big = [_submit(svc, 150, gpus=2), _submit(svc, 40, "name=second", gpus=2)]
    need_mb = math.ceil(2 * (big[0].memory_bytes + PROCESS_BASE_BYTES) / 2**20)
    assert 3000 < 2 * need_mb and need_mb <= 3000
    running = _wait_state(svc, big[0].id, ("running",))
    second = wait_for(lambda: (j := svc.get(big[1].id)).backend_id and j, 60, "the second job handed to Slurm")
    # Slurm's scheduler gives a pending job its reason when it next looks at it (Reason=None until then)
    fields = wait_for(lambda: (f := slurm_cluster.job_fields(second.backend_id)).get("Reason") != "None" and f, 60,
                      "Slurm to say why the second job waits")
    assert fields["JobState"] == "PENDING" and fields["Reason"] == "Resources", fields
    assert slurm_cluster.job_fields(running.backend_id)["JobState"] == "RUNNING"  # it waits for the first one
    assert fields["MinMemoryNode"] == f"{need_mb}M"
    assert svc.get(big[1].id).state == "queued"
    wait_for(lambda: "Resources" in (svc.get(big[1].id).reason or ""), 30, "the server to show Slurm's reason")
    ends = [_wait_state(svc, j.id, ("succeeded", "failed", "cancelled")) for j in big]
    assert [e.state for e in ends] == ["succeeded", "succeeded"], [e.reason for e in ends]
    first_f, second_f = (slurm_cluster.job_fields(e.backend_id) for e in ends)
    assert second_f["StartTime"] >= first_f["EndTime"], (first_f["EndTime"], second_f["StartTime"])
    assert running.slots == ["tf1"] and ends[1].slots == ["tf1"]

    small = [_submit(svc, 40, "name=small1"), _submit(svc, 40, "name=small2")]
    wait_for(lambda: all(svc.get(j.id).state in ("running", "succeeded") for j in small), 120, "both small jobs running")
    ends = [_wait_state(svc, j.id, ("succeeded", "failed", "cancelled")) for j in small]
    one, two = (slurm_cluster.job_fields(e.backend_id) for e in ends)
    assert two["StartTime"] < one["EndTime"], "two jobs that fit together did not run side by side"


def test_slurm_controller_down_keeps_a_job_queued_and_it_runs_when_slurm_is_back(slurm_service, slurm_cluster):
    svc = slurm_service()
    slurm_cluster.stop_controller()
    try:
        job = _submit(svc, 12)
        reason = wait_for(lambda: (j := svc.get(job.id)).reason and "does not answer" in j.reason and j.reason, 60,
                          "the job to say why it waits")
        assert "\n" not in reason and svc.get(job.id).state == "queued" and svc.get(job.id).backend_id is None
    finally:
        slurm_cluster.start_controller()
    done = _wait_state(svc, job.id, ("succeeded", "failed", "cancelled"))
    assert done.state == "succeeded", done.reason
    assert done.restarts == 0 and done.attempt == 1


# ---------------------------------------------------------------- bad input: one line each


def _server(tmp_path, *args: str, env=None) -> subprocess.CompletedProcess:
    from postgres_server import free_port

    return subprocess.run([sys.executable, "-m", "trainforge", "server", "--state-dir", str(tmp_path / "state"),
                           "--port", str(free_port()), "--gpus", "cpu:1", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def _one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_slurm_bad_backend_settings_are_one_line_each(slurm_cluster, tmp_path):
    line = _one_line(_server(tmp_path, "--backend", "nomad"))
    assert "--backend" in line and "slurm" in line and "'nomad'" in line
    line = _one_line(_server(tmp_path, "--backend", "k8s"))
    assert "--backend k8s" in line and "trainforge launch k8s" in line
    line = _one_line(_server(tmp_path, "--slurm-partition", "debug"))
    assert "--slurm-partition" in line and "--backend slurm" in line
    no_slurm = {**slurm_cluster.env, "PATH": str(tmp_path)}
    line = _one_line(_server(tmp_path, "--backend", "slurm", env=no_slurm))
    assert "sbatch" in line and "not on PATH" in line
    line = _one_line(_server(tmp_path, "--backend", "slurm", "--slurm-partition", "nope", env=slurm_cluster.env))
    assert "--slurm-partition" in line and "'nope'" in line and "sinfo" in line
    line = _one_line(_server(tmp_path, "--backend", "slurm", "--slurm-account", "a b", env=slurm_cluster.env))
    assert "--slurm-account" in line
    assert not (tmp_path / "state" / "jobs.db").exists()
    with pytest.raises(UserError):
        check_backend("")


def test_slurm_refusing_a_job_fails_it_with_slurms_line(slurm_service, slurm_cluster):
    """A partition removed after the server started: sbatch refuses, the job fails with Slurm's reason, the queue
    goes on."""
    svc = slurm_service()
    svc.backend.engine = Slurm(SlurmSettings(partition="gone"), env=slurm_cluster.env)
    job = _submit(svc, 12)
    done = _wait_state(svc, job.id, ("failed", "succeeded"), timeout_s=60)
    assert done.state == "failed" and "Slurm refused the job" in done.reason and "partition" in done.reason.lower()
    assert "\n" not in done.reason


@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_slurm_job_on_the_dashboard_like_a_local_one(slurm_service, slurm_cluster, browser):
    """A job Slurm runs, in headless Chromium: its row, state and progress in the table; on its page Slurm's job id,
    the node, the loss and metric curves and the log, all from the run directory Slurm's node wrote."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    svc = slurm_service()
    with LiveServer(svc, manage_service=False) as server:
        job = _submit(svc, 20)
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, JOB_TIMEOUT_S, poll_frequency=0.3)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job-id="{job.id}"][data-state="running"]'))
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#jobs tr[data-job-id="{job.id}"][data-state="succeeded"]'))
        done = svc.get(job.id)
        row = browser.find_element(By.CSS_SELECTOR, f'#jobs tr[data-job-id="{job.id}"]')
        assert "20/20" in row.text and done.slots[0] in row.text
        row.find_element(By.LINK_TEXT, str(job.id)).click()
        wait.until(lambda d: d.find_element(By.ID, "job-state").text == "succeeded")
        assert browser.find_element(By.ID, "job-backend").text == f"slurm job {done.backend_id}"
        assert browser.find_element(By.ID, "job-gpus").text == done.slots[0]
        path = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, '#chart-loss path.series[data-series="train loss"]'))
        assert int(path.get_attribute("data-points")) >= 5
        metric = browser.find_element(By.CSS_SELECTOR, '#chart-metric path.series[data-series="val accuracy"]')
        assert int(metric.get_attribute("data-points")) == 2
        wait.until(lambda d: "test accuracy" in d.find_element(By.ID, "log").text)
        assert f"submitted to slurm as job {done.backend_id}" in browser.find_element(By.ID, "log").text


def test_slurm_jobs_survive_a_server_restart_and_none_is_submitted_twice(slurm_cluster, tmp_path):
    """A server stopped (as by a crash) while Slurm runs its job: a new server on the same state folder follows that
    Slurm job by its id to success, no second attempt. A job handed to Slurm just before a crash, its id never written
    to the table, is found again by its name in Slurm and followed, not submitted a second time."""
    from trainforge.jobs.cluster import engine_name_of

    engine = Slurm(SlurmSettings(partition="debug"), env=slurm_cluster.env)
    first = make_service(tmp_path, "cpu:2", 1.0, engine=engine, engine_poll_s=0.3)
    first.start()
    job = _submit(first, 60)
    running = _wait_state(first, job.id, ("running",))
    first.stop()  # the server goes away; Slurm keeps running the job

    # a second job, handed to Slurm the way the server does, as if the server died before writing the id down
    orphan = first.enqueue(Submission(recipe="digits_cnn", overrides=tuple(with_steps(12))))
    name = engine_name_of(first.state_dir, orphan.id, 1)
    first.backend._submit(first.get(orphan.id), name)
    assert first.get(orphan.id).backend_id is None
    first.store.close()

    second = make_service(tmp_path, "cpu:2", 1.0, engine=engine, engine_poll_s=0.3)
    second.start()
    try:
        done = _wait_state(second, job.id, ("succeeded", "failed", "cancelled"))
        assert done.state == "succeeded" and done.backend_id == running.backend_id and done.attempt == 1
        adopted = _wait_state(second, orphan.id, ("succeeded", "failed", "cancelled"))
        assert adopted.state == "succeeded" and adopted.attempt == 1
        ours = [line for line in slurm_cluster.run("scontrol", "show", "job", "-o").stdout.splitlines()
                if f"JobName={name} " in line]
        assert len(ours) == 1  # Slurm ran it once
        assert adopted.backend_id in ours[0]
    finally:
        second.stop()
        second.store.close()


def test_slurm_ignores_another_users_job_that_carries_our_jobs_name(slurm_cluster, tmp_path):
    """Issue 50, High 1: job names are public (squeue) and anyone may use one. Another Unix user's job named exactly as
    the server names its job 1 is running when the server (re)starts: the server neither follows nor cancels it; it
    submits job 1 itself, which runs once, to success. A job of the server's own user with that name but without the
    server's key in its comment is ignored the same way."""
    from slurm_cluster import add_user

    from trainforge.jobs.cluster import engine_name_of

    engine = Slurm(SlurmSettings(partition="debug"), env=slurm_cluster.env)
    first = make_service(tmp_path, "cpu:2", 1.0, engine=engine, engine_poll_s=0.3)  # not started: job 1 stays queued
    job = first.enqueue(Submission(recipe="digits_cnn", overrides=tuple(with_steps(12))))
    name = engine_name_of(first.state_dir, job.id, 1)
    first.store.close()
    other = add_user()
    foreign = slurm_cluster.run_as(other, "sbatch", "--parsable", f"--job-name={name}", "--partition=debug",
                                   "--output=/dev/null", "--chdir=/", "--mem=64M", "--comment=trainforge:0",
                                   "--wrap", "sleep 600")
    assert foreign.returncode == 0, foreign.stderr
    ours_unkeyed = slurm_cluster.run("sbatch", "--parsable", f"--job-name={name}", "--partition=debug",
                                     "--output=/dev/null", "--chdir=/", "--mem=64M", "--wrap", "sleep 600")
    assert ours_unkeyed.returncode == 0, ours_unkeyed.stderr
    decoys = [foreign.stdout.strip().split(";")[0], ours_unkeyed.stdout.strip().split(";")[0]]
    wait_for(lambda: all(slurm_cluster.job_fields(d).get("JobState") == "RUNNING" for d in decoys), 60,
             "the jobs named like ours to run")

    second = make_service(tmp_path, "cpu:2", 1.0, engine=engine, engine_poll_s=0.3)
    second.start()
    try:
        done = _wait_state(second, job.id, ("succeeded", "failed", "cancelled"))
        assert done.state == "succeeded" and done.attempt == 1 and done.backend_id not in decoys
        submitted = slurm_cluster.job_fields(done.backend_id)
        assert submitted["JobName"] == name and submitted["UserId"].startswith("root(")
        named = [line for line in slurm_cluster.run("scontrol", "show", "job", "-o").stdout.splitlines()
                 if f"JobName={name} " in line]
        assert len(named) == 3  # the two decoys and the one job the server submitted: it ran once
        assert [slurm_cluster.job_fields(d)["JobState"] for d in decoys] == ["RUNNING", "RUNNING"]  # left alone
    finally:
        second.stop()
        second.store.close()
        for decoy in decoys:
            slurm_cluster.run("scancel", decoy)


SLURM_PROBE = """import os, subprocess, tempfile
_conf = os.path.join(tempfile.gettempdir(), "slurm.conf")
with open(_conf, "w") as _f:  # the cluster's slurm.conf, as a job reads it from /etc/slurm on a real cluster
    _f.write({conf!r})
for _argv in (["sbatch", "--parsable", "--wrap", "true"], ["scancel", {victim!r}]):
    try:
        _r = subprocess.run(_argv, capture_output=True, text=True, timeout=60, env={{**os.environ, "SLURM_CONF": _conf}})
        print("SLURM-PROBE", _argv[0], _r.returncode, (_r.stdout + _r.stderr).strip().replace(chr(10), " ")[:300])
    except Exception as _e:
        print("SLURM-PROBE", _argv[0], "error", _e)
"""


def _probe_lines(text: str) -> dict[str, str]:
    return {line.split()[1]: line for line in text.splitlines() if line.startswith("SLURM-PROBE ")}


def test_slurm_a_jobs_code_cannot_reach_the_controller(slurm_cluster, tmp_path):
    """Issue 50, High 3: a job whose model folder ships code (an operator allowed remote code, the recipe opted in)
    runs `sbatch --wrap true` and `scancel` on another job of the server's user, with the cluster's slurm.conf and
    munge's socket in reach. Its fence denies the TCP ports of Slurm's daemons: both fail, no job is submitted,
    the other job runs on. The same code outside the fence submits a job (the probe is real)."""
    from hostile_files import RAN, save_remote_code_model
    from tiny_models import corpus

    from trainforge.jobs import sandbox

    if sandbox.landlock_abi() < sandbox.NET_ABI:  # no fence for TCP ports here: the server refuses such jobs at start
        line = _one_line(_server(tmp_path, "--backend", "slurm", "--allow-remote-code", env=slurm_cluster.env))
        assert "--allow-remote-code" in line and "slurmctld" in line
        return
    victim = slurm_cluster.run("sbatch", "--parsable", "--partition=debug", "--mem=64M", "--output=/dev/null",
                               "--chdir=/", "--wrap", "sleep 600").stdout.strip().split(";")[0]
    probe = SLURM_PROBE.format(conf=slurm_cluster.conf.read_text(), victim=victim)
    data = tmp_path / "data"
    data.mkdir()
    (data / "docs.txt").write_text("\n".join(corpus(200)))
    model = save_remote_code_model(data / "remote", tmp_path / "marker", first=probe)

    def job_count() -> int:
        return len(slurm_cluster.run("scontrol", "show", "job", "-o").stdout.splitlines())

    before = job_count()
    engine = Slurm(SlurmSettings(partition="debug"), env=slurm_cluster.env)
    svc = make_service(tmp_path, "cpu:1", 2.0, engine=engine, engine_poll_s=0.3, data_roots=[data],
                       allow_remote_code=True)
    svc.start()
    try:
        job = svc.enqueue(Submission(recipe="causal_lm_finetune", overrides=(
            f"data.path={data / 'docs.txt'}", f"model.args.pretrained={model}", "model.args.trust_remote_code=true",
            "data.args.block_size=32", "data.val_fraction=0.1", "data.test_fraction=0.1", *with_steps(2))))
        done = _wait_state(svc, job.id, ("succeeded", "failed"))
        log = Path(done.log_path).read_text(errors="replace")
        assert RAN in log, log[-3000:]
        probes = _probe_lines(log)
        assert set(probes) == {"sbatch", "scancel"}, log[-3000:]
        for line in probes.values():
            assert line.split()[2] not in ("0", "error"), line  # refused: the controller is out of reach
        assert job_count() == before + 1  # the training job itself, nothing the probe submitted
        assert slurm_cluster.job_fields(victim)["JobState"] == "RUNNING"
    finally:
        svc.stop()
        svc.store.close()

    unfenced = subprocess.run([sys.executable, "-c", probe.replace(f"[\"scancel\", {victim!r}]", "[\"true\"]")],
                              capture_output=True, text=True, timeout=120, env=slurm_cluster.env)
    submitted = _probe_lines(unfenced.stdout)["sbatch"]
    assert submitted.split()[2] == "0", unfenced.stdout + unfenced.stderr
    slurm_cluster.run("scancel", submitted.split()[3])
    slurm_cluster.run("scancel", victim)


def test_slurm_starts_a_higher_priority_job_first_though_it_came_later(slurm_service, slurm_cluster):
    """Node tf1 (partition `one`) busy with a two-process job; then a priority-0 job, then a priority-50 one, each
    too big to share the node. Slurm (multifactor priority) starts the later, higher-priority job first."""
    svc = slurm_service(partition="one")
    blocker = _submit(svc, 60, gpus=2)
    _wait_state(svc, blocker.id, ("running",))
    low = _submit(svc, 20, "name=low", gpus=2)
    wait_for(lambda: svc.get(low.id).backend_id, 60, "the low-priority job handed to Slurm")
    high = svc.enqueue(Submission(recipe="digits_cnn", overrides=(*with_steps(20), "name=high"), num_gpus=2, priority=50))
    wait_for(lambda: svc.get(high.id).backend_id, 60, "the high-priority job handed to Slurm")
    lo, hi = (slurm_cluster.job_fields(svc.get(j.id).backend_id) for j in (low, high))
    assert (lo["Nice"], hi["Nice"]) == ("100", "50") and int(hi["Priority"]) > int(lo["Priority"])
    ends = {j.id: _wait_state(svc, j.id, ("succeeded", "failed", "cancelled")) for j in (blocker, low, high)}
    assert all(e.state == "succeeded" for e in ends.values()), [e.reason for e in ends.values()]
    lo, hi = (slurm_cluster.job_fields(ends[j.id].backend_id) for j in (low, high))
    assert hi["StartTime"] < lo["StartTime"], (hi["StartTime"], lo["StartTime"])


def test_slurm_requeues_a_job_whose_node_dies_and_it_resumes_bit_identically(slurm_service, slurm_cluster):
    """The node running a job dies (its slurmd and the job's processes SIGKILLed). Slurm marks it down and requeues the
    job (the file's --requeue): the server shows it queued again under the same Slurm id, then running on the other
    node, where it resumes from its newest checkpoint; its weights and eval equal an uninterrupted run's."""
    svc = slurm_service()
    steps = 120  # long enough to be killed after its checkpoint at step 8 and resume; short for the suite
    job = _submit(svc, steps, "train.checkpoint_every_steps=4")
    running = _wait_state(svc, job.id, ("running",))
    (node,) = running.slots
    wait_for(lambda: latest_checkpoint_step(Path(job.run_dir)) >= 8, 180, "a checkpoint at step 8 or later")
    try:
        slurm_cluster.kill_node(node)
        wait_for(lambda: svc.get(job.id).state == "queued" or
                 (svc.get(job.id).state == "running" and svc.get(job.id).slots != [node]), 120,
                 "Slurm to requeue the job")
        done = _wait_state(svc, job.id, ("succeeded", "failed", "cancelled"))
    finally:
        slurm_cluster.start_node(node)
        slurm_cluster.wait_idle()
    assert done.state == "succeeded", done.reason
    assert done.backend_id == running.backend_id and done.attempt == 1 and done.restarts == 0  # Slurm's own requeue
    assert done.slots != [node]
    assert int(slurm_cluster.job_fields(done.backend_id)["Restarts"]) == 1
    log = Path(done.log_path).read_text()
    assert f"slurm requeued job {done.backend_id}" in log and "resumed at step" in log
    reference = _submit(svc, steps, "train.checkpoint_every_steps=4", "name=reference")
    ref = _wait_state(svc, reference.id, ("succeeded", "failed", "cancelled"))
    assert ref.state == "succeeded", ref.reason
    assert (Path(done.run_dir) / FINAL / WEIGHTS).read_bytes() == (Path(ref.run_dir) / FINAL / WEIGHTS).read_bytes()
    assert json.loads((Path(done.run_dir) / "eval.json").read_text()) == json.loads((Path(ref.run_dir) / "eval.json").read_text())


def test_slurm_gpu_jobs_ask_slurm_for_gres_gpus(slurm_cluster, tmp_path):
    """`--gpus gpu:2 --slot-memory-gb 16`: the server describes a node's two GPUs (this machine has none). A two-GPU
    job goes to Slurm with --gpus-per-node=2 (GRES), and Slurm gives it the node's two GPUs (the test cluster's GPUs
    are device files; the job trains on the CPU); a three-GPU job is refused at submission, one line."""
    engine = Slurm(SlurmSettings(partition="debug", cpus_per_process=1), env=slurm_cluster.env)
    svc = make_service(tmp_path, "gpu:2", 16.0, engine=engine, engine_poll_s=0.3)
    svc.start()
    try:
        job = _submit(svc, 12, gpus=2)
        done = _wait_state(svc, job.id, ("succeeded", "failed", "cancelled"))
        assert done.state == "succeeded", done.reason
        fields = slurm_cluster.job_fields(done.backend_id)
        assert fields["TresPerNode"] == "gres:gpu:2" and fields["NumCPUs"] == "2"
        script = (Path(done.log_path).parent / "job.sbatch").read_text()
        assert "#SBATCH --gpus-per-node=2" in script and "train.device=cpu" not in script
        with pytest.raises(UserError) as refused:
            _submit(svc, 12, gpus=3)
        assert "asks for 3 GPUs" in str(refused.value) and "\n" not in str(refused.value)
    finally:
        svc.stop()
        svc.store.close()


def test_slurm_takes_over_a_local_servers_queue_with_its_history(slurm_cluster, tmp_path):
    """Moving a team's queue from this machine to Slurm: a local server with one finished and one running job stops;
    a Slurm server on the same state folder keeps the finished one as it was, stops the local process of the running
    one and resumes it on Slurm (--resume auto), to the end."""
    local = make_service(tmp_path, "cpu:2", 1.0)
    local.start()
    done_locally = _submit(local, 8)
    assert _wait_state(local, done_locally.id, ("succeeded", "failed")).state == "succeeded"
    moving = _submit(local, 400, "train.checkpoint_every_steps=4")
    _wait_state(local, moving.id, ("running",))
    wait_for(lambda: latest_checkpoint_step(Path(moving.run_dir)) >= 8, 120, "a checkpoint at step 8 or later")
    local.stop()  # the local server goes; its job process keeps running until the new server takes over
    local.store.close()

    engine = Slurm(SlurmSettings(partition="debug"), env=slurm_cluster.env)
    cluster = make_service(tmp_path, "cpu:2", 1.0, engine=engine, engine_poll_s=0.3)
    cluster.start()
    try:
        assert runner.job_processes(Path(moving.run_dir)) == []  # stopped before Slurm starts it: one writer
        done = _wait_state(cluster, moving.id, ("succeeded", "failed", "cancelled"))
        assert done.state == "succeeded" and done.backend_id and done.restarts == 0
        log = Path(done.log_path).read_text()
        assert "resumes there with --resume auto" in log and "resumed at step" in log
        kept = cluster.get(done_locally.id)
        assert (kept.state, kept.backend_id, kept.attempt) == ("succeeded", None, 1)
        assert cluster.view(kept)["backend"] == "local" and cluster.view(kept)["progress"]["step"] == 8
        assert cluster.view(done)["backend"] == "slurm"
    finally:
        cluster.stop()
        cluster.store.close()

"""Load and faults: 20 short jobs on 4 CPU slots; a quarter of the job processes SIGKILLed at random moments
and the server itself SIGKILLed and restarted once mid-way. Every job succeeds exactly once: one row each,
each run directory trained by one process at a time with no step logged twice, and every kill that hit
an unfinished job counted as a restart."""
from __future__ import annotations

import collections
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from jobs_helpers import QUICK, free_port, kill_quietly, metrics_rows, quick_job_bytes, wait_for
from trainforge.jobs import runner

pytestmark = pytest.mark.serial  # several processes, or timing: the machine to itself

NUM_JOBS = 20
NUM_KILLS = NUM_JOBS // 4


class ServerProcess:
    def __init__(self, tmp_path: Path, state: Path, port: int, slot_memory_gb: float) -> None:
        self.tmp_path, self.state, self.port, self.slot_memory_gb = tmp_path, state, port, slot_memory_gb
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.tmp_path / f"server-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainforge", "server", "--gpus", "cpu:4", "--slot-memory-gb", repr(self.slot_memory_gb),
             "--port", str(self.port), "--state-dir", str(self.state)],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp_path)
        log.close()

        def healthy() -> bool:
            assert self.proc.poll() is None, (self.tmp_path / f"server-{self.starts}.log").read_text()
            try:
                return httpx.get(self.url + "/api/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 60, "the server to answer", 0.2)

    def crash(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def state_and_parent(pid: int) -> tuple[str, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def parent_of(pid: int) -> int | None:
    found = state_and_parent(pid)
    return found[1] if found else None


def live_trainers(state: Path) -> dict[int, list[int]]:
    """job id -> pids of its live `trainforge train` processes (the wrapper's children). A trainer's own
    forks are not counted: between fork and exec a helper shows the trainer's command line (every trainer
    runs `ldconfig -p` at import, through ctypes.util.find_library). Each process's parent is read in the
    same pass as its command line: read later, a helper that has exec'd and exited in between would have
    no parent to check and would count as a second trainer."""
    found: dict[int, dict[int, int]] = collections.defaultdict(dict)  # job -> {pid: parent pid}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = runner.cmdline(int(entry.name))
        if len(argv) > 4 and argv[1:4] == ["-m", "trainforge", "train"] and argv[4].startswith(str(state)):
            stat = state_and_parent(int(entry.name))  # read after the command line: a fork's parent is still set
            if stat is not None and stat[0] not in ("Z", "X"):
                found[int(Path(argv[4]).parent.name)][int(entry.name)] = stat[1]
    return {job: [p for p, ppid in procs.items() if ppid not in procs] for job, procs in found.items()}


@pytest.mark.slow
def test_twenty_jobs_survive_random_kills_and_a_server_crash(tmp_path):
    rng = random.Random(2024)
    state = tmp_path / "state"
    # one job per slot: 4 at a time, the rest queued (a slot declared larger would be shared by several)
    server = ServerProcess(tmp_path, state, free_port(), slot_memory_gb=1.5 * quick_job_bytes() / 2**30)
    server.start()
    try:
        client = httpx.Client(base_url=server.url, timeout=120, headers={"X-Trainforge-Client": "test"})
        for i in range(NUM_JOBS):
            r = client.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": QUICK, "max_restarts": 10})
            assert r.status_code == 201, r.text

        kills: list[tuple[int, int, bool]] = []  # (job id, pid, hit an unfinished job) of each SIGKILL

        def kill(job_id: int, pid: int) -> None:
            if kill_quietly(pid):
                wait_for(lambda: not runner.is_alive(pid), 10, "the killed process to go", 0.02)
                kills.append((job_id, pid, not runner.run_complete(state / "jobs" / str(job_id) / "run")))
        crashed = False
        most_at_once = max_running = 0
        next_kill = time.monotonic() + rng.uniform(0.5, 2.0)
        deadline = time.monotonic() + 420

        def states() -> collections.Counter:
            return collections.Counter(j["state"] for j in client.get("/api/jobs").json())

        # faults spread over the whole run: each kill waits for a random number of finished jobs
        kill_after_done = sorted(rng.choices(range(NUM_JOBS - 5), k=NUM_KILLS))
        while time.monotonic() < deadline:
            trainers = live_trainers(state)
            most_at_once = max([most_at_once, *map(len, trainers.values())])
            max_running = max(max_running, len(trainers))
            counts = states()
            done = counts["succeeded"] + counts["failed"] + counts["cancelled"]
            if done == NUM_JOBS:
                break
            unfinished = sorted(j for j in trainers if not runner.run_complete(state / "jobs" / str(j) / "run"))
            if (unfinished and len(kills) < NUM_KILLS and done >= kill_after_done[len(kills)]
                    and time.monotonic() >= next_kill):
                job_id = rng.choice(unfinished)
                pid = trainers[job_id][0]
                if rng.random() < 0.3:  # sometimes the wrapper (the process-group leader) instead
                    pid = parent_of(pid) or pid
                kill(job_id, pid)
                next_kill = time.monotonic() + rng.uniform(0.5, 2.5)
            if not crashed and done >= NUM_JOBS // 2 - 2 and len(unfinished) >= 2:
                server.crash()  # mid-way, with jobs running: they must survive and be adopted
                crashed = True
                victim = rng.choice(unfinished)  # one job dies while no server watches it
                kill(victim, trainers[victim][0])
                time.sleep(0.5)
                server.start()
                continue
            time.sleep(0.15)

        jobs = client.get("/api/jobs").json()
        assert crashed and len(kills) >= NUM_KILLS
        assert [j["id"] for j in jobs] == list(range(1, NUM_JOBS + 1))  # one row per job, none lost or doubled
        assert [j["state"] for j in jobs] == ["succeeded"] * NUM_JOBS, [(j["id"], j["state"], j["reason"]) for j in jobs]
        assert most_at_once == 1, doubled  # never two trainers on one run directory
        assert max_running <= 4 and max_running >= 3  # the slots, used

        restarts = {j["id"]: j["restarts"] for j in jobs}
        for j in jobs:
            run_dir = Path(j["run_dir"])
            keys = [(r["split"], r["step"]) for r in metrics_rows(run_dir)]
            assert len(keys) == len(set(keys)), f"job {j['id']}: a step was logged twice"
            assert max(step for _, step in keys) == 20 and runner.run_complete(run_dir)
            log = (run_dir.parent / "log.txt").read_text()
            starts = sum(1 for line in log.splitlines() if line.startswith("[trainforge-jobs] attempt ") and " on cpu" in line)
            assert starts == restarts[j["id"]] + 1, f"job {j['id']}: {starts} starts, {restarts[j['id']]} restarts"

        # a kill "hit" when the job had not finished: each such kill must show as a restart of that job
        hits = collections.Counter(job_id for job_id, _, hit in kills if hit)
        assert sum(hits.values()) >= NUM_KILLS, "too few kills landed on unfinished jobs for the test to mean something"
        assert sum(restarts.values()) >= sum(hits.values())
        assert all(restarts[job_id] >= n for job_id, n in hits.items())
        adopted = sum("adopted by a restarted server" in (state / "jobs" / str(i) / "log.txt").read_text()
                      for i in restarts)
        assert adopted >= 1  # jobs running through the server crash were adopted, not restarted
        assert live_trainers(state) == {}
        print(f"kills {kills}; restarts {sum(restarts.values())}; adopted {adopted}")
    finally:
        if server.proc and server.proc.poll() is None:
            server.crash()
        for job_dir in (state / "jobs").glob("*"):
            runner.kill_leftovers(job_dir / "run")

"""The Slurm backend of the job server (`trainforge server --backend slurm`): Slurm places and runs the jobs, the
server keeps its queue, priorities, admission, restarts, logs and dashboard.

    slurm = Slurm(SlurmSettings(partition="gpu", account="vision"))
    slurm.check()                                    # sbatch on PATH, the partition exists (a UserError: one line)
    job_id = slurm.start_batch_job(script, job_dir=d, log=d / "log.txt", mem_mb=2200, nice=100, env=job_env)
    states = slurm.poll()                            # {"123": EngineJob(phase="running", ...), ...}
    slurm.cancel("123")

The script is the job file `trainforge launch slurm` writes (launch/manifests.py), rendered for the job; what only
the server decides (where the log goes, the working directory, the memory the plan needs, the order) is given to
sbatch on its command line. The server submits as its own user; a submitter never names a partition, an account or
a QoS: those are the server's settings.

Everything is done through Slurm's own commands (sbatch, scontrol, scancel), with the environment the server was
started with (SLURM_CONF included). A controller that does not answer is `EngineDown`: nothing changes, and the
server asks again on its next poll; a submission Slurm refuses (a partition that does not exist, a request no node
can meet) is `EngineRefused` with Slurm's own line.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from trainforge.errors import UserError

# Slurm job states (squeue(1) "JOB STATE CODES") as the server's phases
PENDING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD",
                     "SPECIAL_EXIT", "RESIZING"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "SUSPENDED", "STOPPED"})
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED", "REVOKED"})
DOWN_WORDS = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
              "Connection refused", "Communication connection failure", "Slurm backup controller in standby",
              "Could not establish a configuration source", "Transport endpoint is not connected")
COMMAND_TIMEOUT_S = 60.0
_WORD = re.compile(r"[A-Za-z0-9._,:-]+\Z")


class EngineDown(Exception):
    """The engine's controller does not answer: try again later, change nothing."""


class EngineRefused(Exception):
    """The engine will not take this job (its own line says why): the job fails with it."""


@dataclass(frozen=True)
class EngineJob:
    """A job as the engine reports it: `phase` pending | running | ended; `state` in the engine's own words."""

    phase: str
    state: str
    reason: str = ""
    nodes: tuple[str, ...] = ()
    exit_code: Optional[int] = None  # ended: the batch script's exit status; -N when signal N ended it
    name: str = ""  # the job's name in the engine
    comment: str = ""  # what the server wrote beside the name (its proof that the job is its own)


@dataclass(frozen=True)
class SlurmSettings:
    """The server's Slurm settings (`trainforge server --slurm-partition ...`); None: the cluster's default."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_limit: Optional[str] = None  # sbatch --time, e.g. 24:00:00
    cpus_per_process: Optional[int] = None  # None: 1 per CPU process, 8 per GPU

    def __post_init__(self) -> None:
        for option in ("partition", "account", "qos", "time_limit"):
            value = getattr(self, option)
            if value is not None and not _WORD.match(value):
                raise UserError(f"--slurm-{option.replace('_', '-')}: {value!r} has characters sbatch would misread; "
                                "use letters, digits and . _ , : -")
        if self.cpus_per_process is not None and self.cpus_per_process < 1:
            raise UserError(f"--slurm-cpus-per-process: expected 1 or more, got {self.cpus_per_process}")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return re.sub(r"^(sbatch|scontrol|scancel|squeue|sinfo): (error|fatal): ", "", line)[:300]
    return ""


def _is_down(text: str) -> bool:
    return any(word.lower() in text.lower() for word in DOWN_WORDS)


class Slurm:
    name = "slurm"

    def __init__(self, settings: SlurmSettings = SlurmSettings(), env: Optional[Mapping[str, str]] = None,
                 uid: Optional[int] = None) -> None:
        self.settings = settings
        self.env = dict(os.environ if env is None else env)
        self.uid = os.getuid() if uid is None else uid  # the server's user: the only owner whose jobs it follows

    # ------------------------------------------------------------ commands

    def _command(self, name: str) -> str:
        found = shutil.which(name, path=self.env.get("PATH"))
        if found is None:
            raise UserError(f"--backend slurm: `{name}` is not on PATH; install Slurm's client commands (Debian: "
                            "slurm-client) on the server's machine, or run the server where they are")
        return found

    def _run(self, argv: list[str], env: Optional[Mapping[str, str]] = None, **kwargs) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self._command(argv[0]), *argv[1:]], env=dict(env or self.env), capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL, **kwargs)
        except subprocess.TimeoutExpired:
            raise EngineDown(f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S:.0f} s") from None

    def job_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """A job's environment plus what Slurm's own commands in its script need (where slurm.conf is)."""
        extra = {k: self.env[k] for k in ("SLURM_CONF",) if k in self.env}
        return {**env, **extra}

    # ------------------------------------------------------------ the interface the job service uses

    def check(self) -> Optional[str]:
        """At server start: sbatch and friends on PATH, and the partition (when one is set) known to the controller.
        A UserError when the server cannot work; a warning line when the controller is down (jobs then wait)."""
        for name in ("sbatch", "scontrol", "scancel"):
            self._command(name)
        partition = self.settings.partition
        out = self._run(["scontrol", "show", "partition", "-o", *([partition] if partition else [])])
        if out.returncode != 0:
            line = _first_line(out.stderr or out.stdout)
            if _is_down(line):
                return f"slurmctld does not answer ({line}); jobs stay queued until it does"
            if partition:
                raise UserError(f"--slurm-partition: Slurm does not know partition {partition!r} ({line}); "
                                f"`sinfo -s` lists the partitions")
            raise UserError(f"--backend slurm: {line}")
        return None

    def start_batch_job(self, script: Path, *, job_dir: Path, log: Path, name: str, mem_mb: Optional[int], nice: int,
               env: Mapping[str, str], comment: str = "") -> str:
        """sbatch the job file; Slurm's job id. The log appends (a requeued or restarted job adds to it)."""
        argv = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", "--open-mode=append",
                f"--chdir={job_dir}", f"--nice={max(0, nice)}", *([f"--comment={comment}"] if comment else [])]
        if mem_mb is not None:
            argv.append(f"--mem={mem_mb}M")
        out = self._run([*argv, str(script)], env=self.job_env(env))
        if out.returncode != 0:
            line = _first_line(out.stderr or out.stdout)
            if _is_down(line):
                raise EngineDown(line)
            raise EngineRefused(f"Slurm refused the job: {line.replace('Batch job submission failed: ', '')}")
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise EngineRefused(f"sbatch answered {out.stdout.strip()[:100]!r}, not a job id")
        return job_id

    def poll(self) -> dict[str, EngineJob]:
        """Every job of the server's user the controller still knows (pending, running, and ended within its
        MinJobAge), by id. Another user's job is never reported, whatever its name: names are visible in squeue to
        everyone, and anyone may give a job any name."""
        out = self._run(["scontrol", "show", "job", "-o"])
        if out.returncode != 0:
            line = _first_line(out.stderr or out.stdout)
            if "No jobs in the system" in line:
                return {}
            raise EngineDown(line)
        jobs = {}
        for text in out.stdout.splitlines():
            fields = _fields(text)
            if "JobId" in fields and _uid(fields.get("UserId", "")) == self.uid:
                jobs[fields["JobId"]] = _engine_job(fields)
        return jobs

    def daemon_ports(self) -> tuple[int, ...]:
        """The TCP ports of Slurm's daemons: slurmctld's (a range when it has several), slurmd's default and each
        node's own, slurmdbd's. A job's fence denies them (its code could otherwise reach the controller with the
        server's munge credential: sbatch, scancel). EngineDown when the controller does not answer."""
        ports: set[int] = set()
        for argv in (["scontrol", "show", "config"], ["scontrol", "show", "node", "-o"]):
            out = self._run(argv)
            if out.returncode != 0:
                raise EngineDown(_first_line(out.stderr or out.stdout))
            for key, value in re.findall(r"\b(SlurmctldPort|SlurmdPort|AccountingStoragePort|Port)\s*=\s*(\d+(?:-\d+)?)",
                                         out.stdout):
                low, _, high = value.partition("-")
                ports.update(range(int(low), int(high or low) + 1))
        ports.discard(0)  # AccountingStoragePort = 0: no slurmdbd
        return tuple(sorted(ports))

    def cancel(self, job_id: str) -> None:
        """scancel: Slurm sends SIGTERM to the job's processes (each rank checkpoints), SIGKILL after KillWait."""
        out = self._run(["scancel", job_id])
        if out.returncode != 0:
            line = _first_line(out.stderr or out.stdout)
            if _is_down(line):
                raise EngineDown(line)
            # "Job/step already completing or completed", "Invalid job id": nothing left to cancel


def _fields(text: str) -> dict[str, str]:
    """`scontrol show job -o` as KEY -> value (the first of a repeated key)."""
    fields: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def _uid(text: str) -> Optional[int]:
    """UserId=name(1000) -> 1000; None when Slurm did not say."""
    match = re.fullmatch(r"[^()]*\((\d+)\)", text)
    return int(match.group(1)) if match else None


def _exit_code(text: str) -> Optional[int]:
    """Slurm's ExitCode=RC:SIG as one number: -SIG when a signal ended it, else RC."""
    rc, _, sig = text.partition(":")
    try:
        rc_n, sig_n = int(rc), int(sig or 0)
    except ValueError:
        return None
    return -sig_n if sig_n else rc_n


def _nodes(text: str) -> tuple[str, ...]:
    return () if text in ("", "(null)") else (text,)


def _engine_job(fields: Mapping[str, str]) -> EngineJob:
    state = fields.get("JobState", "")
    reason = fields.get("Reason", "None")
    reason = "" if reason == "None" else reason
    name, nodes = fields.get("JobName", ""), _nodes(fields.get("NodeList", ""))
    comment = fields.get("Comment", "")
    if state in ENDED:
        return EngineJob("ended", state, reason, nodes, _exit_code(fields.get("ExitCode", "")), name, comment)
    if state in RUNNING:
        return EngineJob("running", state, reason, nodes, name=name, comment=comment)
    return EngineJob("pending", state or "UNKNOWN", reason, name=name, comment=comment)

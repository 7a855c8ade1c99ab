"""A real Slurm cluster on localhost for the tests: munged, slurmctld and one slurmd per node (Debian's slurm-wlm and
munge), all in a private folder, on free ports, talking through their own munge socket; nothing of the machine's
own Slurm or munge configuration is read or changed.

    cluster = SlurmCluster(nodes={"tf1": 3000, "tf2": 3000}, cpus=4, gpus=2).start()
    env = cluster.env                       # SLURM_CONF for sbatch, squeue, scancel ...
    cluster.stop_controller(); cluster.start_controller()
    cluster.kill_node("tf2")                # SIGKILL that node's slurmd (and the job steps it runs)
    cluster.stop()

Several slurmd on one machine: each node has its own NodeName, port, spool folder and pid file, and is started with
`slurmd -N NAME` (Debian builds Slurm with multiple-slurmd support). `SlurmdParameters=config_overrides` lets a node
declare more CPUs or memory than the machine has: the scheduler decides with the declared numbers.
The daemons run as root (slurmd must, to start job steps): without root the fixture skips.
"""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Optional

from postgres_server import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def slurm_missing() -> Optional[str]:
    """Why this machine cannot run the test cluster (one line), or None."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if missing:
        return (f"Slurm/munge not installed ({', '.join(missing)} missing); as root, `make test` installs them "
                "(scripts/test-system-packages.sh: slurmctld slurmd slurm-client munge)")
    if os.geteuid() != 0:
        return "the test Slurm cluster runs slurmd, which must run as root; run the Slurm tests as root"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    def __init__(self, nodes: Mapping[str, int], cpus: int = 4, partitions: Optional[Mapping[str, list[str]]] = None,
                 kill_wait_s: int = 5, gpus: int = 0) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="trainforge-slurm-"))
        os.chmod(self.root, 0o755)  # munged refuses a socket folder others may write; everyone may enter it
        self.nodes = dict(nodes)  # name -> RealMemory in MB
        self.cpus = cpus
        self.partitions = partitions or {"debug": list(self.nodes)}
        self.kill_wait_s = kill_wait_s
        self.gpus = gpus  # GPUs each node declares as GRES (counted, no device files): Slurm schedules them
        self.ctld_port = free_port()
        self.node_ports = {name: free_port() for name in self.nodes}
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.pids: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        r = self.root
        lines = [
            "ClusterName=trainforge-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            # cred_expire is also how long a requeued job waits before it may start again (120 s by default), and
            # backfill, which starts it then, looks every bf_interval (30 s): a test cluster need not wait that long
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket},cred_expire=10", "CredType=cred/munge",
            "SchedulerParameters=bf_interval=2",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool-%n",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill", "ReturnToService=2",
            # multifactor priority: every job gets 10000 from its partition, minus its nice (the job server's priority)
            "PriorityType=priority/multifactor", "PriorityWeightPartition=10000", "PriorityWeightAge=0",
            "PriorityWeightFairshare=0", "PriorityWeightJobSize=0", "PriorityWeightQOS=0",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MinJobAge=3600", f"KillWait={self.kill_wait_s}",
            "SlurmdTimeout=10", "SlurmctldTimeout=10", "MessageTimeout=5",
            "SlurmdParameters=config_overrides", "PlugStackConfig=/dev/null",
        ]
        if self.gpus:  # device files Slurm accepts (character devices, /dev/null's numbers); nothing uses them
            lines.append("GresTypes=gpu")
            (self.root / "gpus").mkdir()
            for i in range(self.gpus):
                os.mknod(self.root / "gpus" / f"gpu{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
            (self.root / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={self.root}/gpus/gpu[0-{self.gpus - 1}]\n")
        for name, memory_mb in self.nodes.items():
            lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={self.node_ports[name]} "
                         f"CPUs={self.cpus} RealMemory={memory_mb}" + (f" Gres=gpu:{self.gpus}" if self.gpus else ""))
        for i, (part, members) in enumerate(self.partitions.items()):
            lines.append(f"PartitionName={part} Nodes={','.join(members)} Default={'YES' if i == 0 else 'NO'} "
                         "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, key: str, argv: list[str]) -> None:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{argv[0]} failed: {proc.stderr}{self.logs()}"

    def start(self) -> "SlurmCluster":
        (self.root / "state").mkdir()
        munge = self.root / "munge"
        munge.mkdir(mode=0o755)
        key = munge / "munge.key"
        subprocess.run([_exe("mungekey"), "--create", f"--keyfile={key}"], check=True, capture_output=True)
        self._daemon("munged", [_exe("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                                f"--pid-file={munge}/munged.pid", f"--log-file={munge}/munged.log",
                                f"--seed-file={munge}/munged.seed"])
        self.pids["munged"] = int((munge / "munged.pid").read_text())
        self._write_conf()
        self.start_controller()
        for name in self.nodes:
            self.start_node(name)
        self.wait_idle()
        return self

    def start_controller(self) -> None:
        (self.root / "slurmctld.pid").unlink(missing_ok=True)  # a stopped daemon's pid file: not the new one's
        self._daemon("slurmctld", [_exe("slurmctld"), "-f", str(self.conf)])
        self.pids["slurmctld"] = self._pid_file("slurmctld.pid")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.run("sinfo", "-h").returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError("slurmctld does not answer" + self.logs())

    def stop_controller(self) -> None:
        self._kill("slurmctld", signal.SIGTERM)

    def start_node(self, name: str) -> None:
        (self.root / f"slurmd-{name}.pid").unlink(missing_ok=True)
        self._daemon(f"slurmd-{name}", [_exe("slurmd"), "-f", str(self.conf), "-N", name])
        self.pids[f"slurmd-{name}"] = self._pid_file(f"slurmd-{name}.pid")

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's slurmd, its job steps' slurmstepd and every task process of the node (a node that
        dies): the tasks are the processes whose environment names this node and this cluster, their slurmstepd each
        one's parent."""
        self._kill(f"slurmd-{name}", signal.SIGKILL)
        for pid in node_processes(name, self.conf):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def wait_idle(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        states = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
            states = out.stdout
            if out.returncode == 0 and len(set(states.split())) and all(
                    line.split()[1] in ("idle", "mix", "alloc") for line in states.splitlines() if line.strip()):
                if {line.split()[0] for line in states.splitlines()} >= set(self.nodes):
                    return
            time.sleep(0.3)
        raise AssertionError(f"nodes not idle: {states}" + self.logs())

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.run_env(self.env, *argv, timeout=timeout)

    def run_env(self, env: Mapping[str, str], *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([_exe(argv[0]), *argv[1:]], env=dict(env), capture_output=True, text=True,
                              timeout=timeout)

    def run_as(self, user: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command run by another Unix user (`add_user`), as that user would run it on this cluster."""
        return subprocess.run(["runuser", "-u", user, "--", _exe(argv[0]), *argv[1:]], env=self.env,
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as KEY -> value (JobState, ExitCode, NodeList, ...); {} when Slurm does not know it."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id))
        fields = {}
        for word in out.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_job(self, job_id: str, timeout_s: float = 300) -> tuple[str, str]:
        """(JobState, ExitCode) once the job has ended (COMPLETED, FAILED, CANCELLED, ...)."""
        deadline = time.monotonic() + timeout_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job_fields(job_id)
            if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                          "BOOT_FAIL", "DEADLINE", "PREEMPTED"):
                return fields["JobState"], fields.get("ExitCode", "")
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {fields.get('JobState')} after {timeout_s} s" + self.logs())

    def _pid_file(self, name: str) -> int:
        path = self.root / name
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                return int(path.read_text())
            except (OSError, ValueError):
                time.sleep(0.1)
        raise AssertionError(f"no pid file {path}" + self.logs())

    def _kill(self, key: str, sig: int) -> None:
        pid = self.pids.pop(key, None)
        if pid is None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
                break
            time.sleep(0.1)

    def logs(self) -> str:
        text = []
        for path in sorted(self.root.glob("*.log")):
            text.append(f"\n--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
        return "".join(text)

    def stop(self) -> None:
        self.run("scancel", "--full", "-u", "root")
        for key in [k for k in self.pids if k.startswith("slurmd-")]:
            self._kill(key, signal.SIGTERM)
        self._kill("slurmctld", signal.SIGTERM)
        self._kill("munged", signal.SIGTERM)
        for pid in _daemons_of(self.conf):  # any daemon of this cluster a restart left unrecorded
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def add_user(name: str = "tf-other") -> str:
    """A second Unix user of this machine (made once, no home, no login): someone else on the same cluster."""
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)
    return name


def node_processes(name: str, conf: Path) -> list[int]:
    """The task processes of node `name` of the cluster whose slurm.conf is `conf` (SLURMD_NODENAME and SLURM_CONF in
    their environment: another test's cluster may have a node of the same name) and the slurmstepd above them."""
    tasks, stepds = set(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        variables = environ.split(b"\0")
        if f"SLURMD_NODENAME={name}".encode() in variables and f"SLURM_CONF={conf}".encode() in variables:
            tasks.add(int(entry.name))
            parent = int(stat[stat.rfind(")") + 2:].split()[1])
            try:
                if Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"slurmstepd"):
                    stepds.add(parent)
            except OSError:
                pass
    return sorted(stepds) + sorted(tasks - stepds)


def _daemons_of(conf: Path) -> list[int]:
    """slurmctld and slurmd processes started with `-f conf`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(conf).encode() in argv and any(a.endswith((b"slurmd", b"slurmctld")) for a in argv[:1]):
                found.append(int(entry.name))
    return found

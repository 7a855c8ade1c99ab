"""The operating system's fence around a job of the server: Landlock (Linux 6.2+), applied before the trainer starts.

    abi = landlock_abi()                       # 0: this kernel has no Landlock; the server needs MIN_ABI
    policy = job_policy(run_dir=..., tmp_dir=..., job_dir=..., data_roots=roots, caches=caches)
    policy.save(job_dir / "sandbox.json")      # the wrapper reads it and fences the trainer (`preexec`)
    restrict(policy)                           # or fence the calling thread itself (the size check's child)

A process under `restrict(policy)` and everything it starts, for good (nothing can lift it):
- writes (creates, removes, renames, truncates) only under `policy.write`: the run directory, a private temp
  directory and /dev/shm (torch's DataLoader and NCCL pass tensors through it);
- reads only under `policy.read`: the data roots, the model caches, the Python installation, the job's own folder,
  and the system's software (/usr, /lib*, /bin, /sbin, /etc, /proc, /sys); opens the device files in /dev (GPUs);
- from ABI 6 (Linux 6.12) on, cannot signal a process outside its sandbox (another job, the server) nor reach
  an abstract UNIX socket outside it. In every ABI it cannot ptrace one, which also keeps another process's
  /proc/<pid>/environ and /proc/<pid>/mem out of reach.
Landlock is used rather than a mount namespace (bubblewrap) or a user per job: it needs no privilege, no setuid
helper and no user namespaces (which some distributions switch off), the paths stay what they are, and the fence
is inherited by torchrun's workers and DataLoader processes without any cooperation from them.

What Landlock does not fence (docs/jobs.md, "Security model"): reading file metadata (stat) anywhere, connecting
to UNIX sockets that have a path, and file descriptors opened before the fence (the log file the server hands the
job). TCP is open, except the ports in `policy.denied_tcp_ports` (from ABI 4, Linux 6.7): on the Slurm backend the
controller's and the nodes' daemons, so a job's code cannot reach Slurm with the server's munge credential. MIN_ABI is 3 because before it `truncate(2)` on any path was not covered.

The kernel interface is three system calls; they are called through ctypes here (see `_Landlock`) because the
Python bindings on PyPI are development releases that do not negotiate the ABI (they ask for access rights an
older kernel rejects) nor tell a file rule from a directory rule.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

MIN_ABI = 3  # truncate(2) is fenced from ABI 3 (Linux 6.2) on; below it a job could empty any file by path
SIGNAL_SCOPE_ABI = 6  # Linux 6.12: signals and abstract UNIX sockets scoped to the sandbox

# <linux/landlock.h>
_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = (1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13,
                                                                         1 << 14, 1 << 15)
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
NET_CONNECT_TCP = 1 << 1
_RULE_NET_PORT = 2
NET_ABI = 4  # Linux 6.7: TCP bind/connect by port
MAX_PORT = 65535
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # rights each ABI knows
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only rights a rule on a file may carry

READ = READ_FILE | READ_DIR | EXECUTE
WRITE = (1 << 16) - 1  # everything under a writable folder, renames across its folders included
DEVICES = READ_FILE | WRITE_FILE | READ_DIR | TRUNCATE | IOCTL_DEV  # /dev: use the devices there, create nothing

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys")
SYSTEM_WRITE = ("/dev/shm",)  # torch.multiprocessing and NCCL share memory through it (names there are unlinked)
SYSTEM_DEVICES = ("/dev",)


class SandboxError(RuntimeError):
    """The fence could not be put up: the job must not start without it."""


@dataclass(frozen=True)
class Policy:
    """What a fenced process may touch: folders (or files) it may read, folders it may write, device folders."""

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    denied_tcp_ports: tuple[int, ...] = ()  # TCP ports it may not connect to (any address); every other is open
    deny_all_tcp: bool = False  # no TCP connect at all (a cluster's daemons whose ports are not known yet)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> "Policy":
        doc = json.loads(Path(path).read_text())
        return cls(**{k: tuple(str(p) for p in doc.get(k, ())) for k in ("read", "write", "devices")},
                   denied_tcp_ports=tuple(int(p) for p in doc.get("denied_tcp_ports", ())),
                   deny_all_tcp=bool(doc.get("deny_all_tcp", False)))


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers; 0 when it has none (not Linux, too old, or switched off)."""
    numbers = _SYS.get(os.uname().machine) if sys.platform.startswith("linux") else None
    if numbers is None:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def python_paths() -> tuple[str, ...]:
    """The Python installation this process runs from: prefixes, the interpreter, and every folder on sys.path."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    found += [p for p in sys.path[1:] if p and os.path.isdir(p)]  # [0]: the script's folder or the working directory
    return tuple(dict.fromkeys(os.path.realpath(p) for p in found))


def job_policy(*, run_dir: Path, tmp_dir: Path, job_dir: Path, data_roots: Sequence[Path],
               caches: Sequence[Path], writable_caches: bool = False, prepared: Optional[Path] = None) -> Policy:
    """A job's fence: write its run directory and temp directory; read its folder, the data roots, the model caches
    and the server's cache of `prepared` data (manifests, token shards its admission check made)."""
    caches = tuple(str(c) for c in caches)
    shared = (str(prepared),) if prepared is not None else ()
    return Policy(
        read=(*SYSTEM_READ, *python_paths(), *_link_targets(), str(job_dir), *map(str, data_roots), *caches, *shared),
        write=(*SYSTEM_WRITE, str(run_dir), str(tmp_dir), *(caches if writable_caches else ())),
        devices=SYSTEM_DEVICES,
    )


def check_policy(*, tmp_dir: Path, data_roots: Sequence[Path], caches: Sequence[Path],
                 prepared: Optional[Path] = None, denied_tcp_ports: tuple[int, ...] = (),
                 deny_all_tcp: bool = False) -> Policy:
    """The size check's fence: it reads what the job would read, and writes only its own temp directory and the
    server's cache of prepared data (`prepared`: manifests and token shards, which the jobs then only read)."""
    return Policy(read=(*SYSTEM_READ, *python_paths(), *_link_targets(), *map(str, data_roots), *map(str, caches)),
                  write=(*SYSTEM_WRITE, str(tmp_dir), *([str(prepared)] if prepared else [])), devices=SYSTEM_DEVICES,
                  denied_tcp_ports=tuple(denied_tcp_ports), deny_all_tcp=deny_all_tcp)


def _link_targets() -> tuple[str, ...]:
    """Folders outside /etc that its links lead to (resolv.conf -> /run/systemd/resolve/...): Landlock judges the
    real path, so a host name could not be resolved without them."""
    targets = []
    for name in ("/etc/resolv.conf", "/etc/localtime", "/etc/hosts"):
        real = os.path.realpath(name)
        if real != name and not real.startswith(("/etc/", "/usr/")) and os.path.exists(real):
            targets.append(os.path.dirname(real))
    return tuple(targets)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


@dataclass
class _Landlock:
    """A ruleset built from a Policy (in the process that will apply it, or in its parent before fork: what the
    child then does is system calls only)."""

    policy: Policy
    abi: int = field(default_factory=landlock_abi)
    fd: int = -1
    libc: Optional[ctypes.CDLL] = None
    last_cap: int = 63

    def build(self) -> "_Landlock":
        if self.abi < MIN_ABI:
            raise SandboxError(unavailable_reason(self.abi))
        create, add_rule, _ = _SYS[os.uname().machine]
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        try:
            self.last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        except (OSError, ValueError):
            pass
        handled = _FS_BY_ABI[max(k for k in _FS_BY_ABI if k <= self.abi)]
        scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if self.abi >= SIGNAL_SCOPE_ABI else 0
        denied = set(self.policy.denied_tcp_ports)
        fenced = bool(denied) or self.policy.deny_all_tcp
        if fenced and self.abi < NET_ABI:
            raise SandboxError(f"this kernel ({os.uname().release}) has Landlock ABI {self.abi}; keeping a job from "
                               f"TCP ports needs ABI {NET_ABI} (Linux 6.7+)")
        net = NET_CONNECT_TCP if fenced else 0
        attr = _RulesetAttr(handled, net, scoped)  # an older kernel takes the larger struct: its new fields are 0
        self.fd = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
        if self.fd < 0:
            raise SandboxError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
        for paths, rights in ((self.policy.read, READ), (self.policy.write, WRITE), (self.policy.devices, DEVICES)):
            for path in paths:
                self._allow(libc, add_rule, path, rights & handled)
        if denied and not self.policy.deny_all_tcp:  # Landlock allows by rule only: every port but these gets one
            port_attr = _NetPortAttr(NET_CONNECT_TCP, 0)
            for port in range(MAX_PORT + 1):
                if port in denied:
                    continue
                port_attr.port = port
                if libc.syscall(add_rule, ctypes.c_int(self.fd), ctypes.c_int(_RULE_NET_PORT), ctypes.byref(port_attr),
                                ctypes.c_uint32(0)) != 0:
                    raise SandboxError(f"landlock_add_rule(port {port}) failed: {os.strerror(ctypes.get_errno())}")
        return self

    def _allow(self, libc: ctypes.CDLL, add_rule: int, path: str, rights: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # /lib32 on most machines: nothing to allow
        except OSError as e:
            raise SandboxError(f"cannot open {path} to allow it ({e.strerror})") from None
        try:
            if not os.path.isdir(path):
                rights &= _FILE_RIGHTS
            attr = _PathBeneathAttr(rights, fd)
            if libc.syscall(add_rule, ctypes.c_int(self.fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(attr),
                            ctypes.c_uint32(0)) != 0:
                raise SandboxError(f"landlock_add_rule({path}) failed: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)

    def enforce(self) -> None:
        """Fence the calling thread (and what it starts from now on): drop every capability, then restrict. Only
        system calls through ctypes, so it is fit for a preexec_fn."""
        libc = self.libc
        assert libc is not None, "build() first"
        _drop_capabilities(libc, self.last_cap)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS[os.uname().machine][2], ctypes.c_int(self.fd), ctypes.c_uint32(0)) != 0:
            raise SandboxError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities(libc: ctypes.CDLL, last_cap: int) -> None:
    """No capability now or after exec. A server run as root would otherwise hand its jobs CAP_SYS_PTRACE, which
    lets them past Landlock's ptrace rule (/proc/<server>/environ), and CAP_DAC_OVERRIDE. For another user this
    changes nothing (it has none; the calls fail harmlessly)."""
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(last_cap + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # root's exec grants only what is left in the bounding set
    libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), ctypes.byref((_CapData * 2)()))


def unavailable_reason(abi: int) -> str:
    have = f"Landlock ABI {abi}" if abi else "no Landlock"
    return (f"this kernel ({os.uname().release}) has {have}; fencing jobs needs ABI {MIN_ABI} or newer (Linux 6.2+, "
            "with landlock in the kernel's lsm= list)")


UNSANDBOXED_FLAG = "--unsandboxed-jobs"


def unfenced_refusal(abi: int) -> str:
    """Why a server will not start on this kernel, and the flag that makes it start anyway."""
    return (f"{UNSANDBOXED_FLAG}: {unavailable_reason(abi)}, so a job could write anywhere this user can; run the "
            f"server on such a kernel, or pass {UNSANDBOXED_FLAG} to run jobs unfenced (only where every submitter "
            "is trusted)")


def remote_code_refusal(backend: str, allow_remote_code: bool, sandboxed: bool, abi: int) -> str:
    """Why a server will not start with --allow-remote-code ("" when it may): on a cluster backend, a job's code
    could reach the engine's controller with the server's own credential unless the fence denies its ports."""
    if backend == "local" or not allow_remote_code or (sandboxed and abi >= NET_ABI):
        return ""
    why = (f"jobs run unfenced ({UNSANDBOXED_FLAG})" if not sandboxed else
           f"the fence keeps a job from Slurm's ports from Landlock ABI {NET_ABI} (Linux 6.7) on, this kernel has ABI {abi}")
    return (f"--allow-remote-code: on the {backend} backend a job's own code could reach slurmctld with this server's "
            f"munge credential (sbatch, scancel as this user): {why}; drop --allow-remote-code, or run the server on "
            "a newer kernel")


def restrict(policy: Policy) -> None:
    """Fence the calling thread for good (a child that runs nothing else yet: the size check)."""
    ruleset = _Landlock(policy).build()
    try:
        ruleset.enforce()
    finally:
        ruleset.close()


def preexec(policy: Policy) -> Callable[[], None]:
    """A subprocess preexec_fn that fences the child before it execs. The ruleset is built here, in the parent, so
    the child only makes the two system calls of `enforce`; a failure there ends the child with status 126."""
    ruleset = _Landlock(policy).build()

    def fence() -> None:
        try:
            ruleset.enforce()
        except SandboxError:
            os._exit(126)

    return fence


def describe(abi: Optional[int] = None) -> str:
    """A line for the server's start: what the fence covers on this kernel."""
    abi = landlock_abi() if abi is None else abi
    if abi < MIN_ABI:
        return f"off ({unavailable_reason(abi)})"
    scope = "signals and abstract sockets scoped" if abi >= SIGNAL_SCOPE_ABI else \
        f"signals not scoped (ABI {SIGNAL_SCOPE_ABI}, Linux 6.12, needed)"
    return f"Landlock ABI {abi} (writes: run dir + temp dir; reads: data roots, caches, software; {scope})"

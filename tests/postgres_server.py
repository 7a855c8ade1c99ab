"""A throwaway PostgreSQL server for tests that need a real one (the job store, tune's shared storage)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Optional[Path]:
    """The directory with initdb and pg_ctl (Debian: /usr/lib/postgresql/<ver>/bin), or None."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return versions[-1].parent if versions else None


class Postgres:
    """A throwaway PostgreSQL server on a free port; as the `postgres` OS user when we are root."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        # not under pytest's tmp_path: its root-only parent folders would lock the postgres user out
        self.root = Path(tempfile.mkdtemp(prefix="trainforge-pg-"))
        self.data = self.root / "data"
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if self.user:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)

    def start(self) -> "Postgres":
        if self.user:
            shutil.chown(self.root, self.user)
        r = self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        assert r.returncode == 0, r.stderr
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        r = self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log.txt"), "-w", "-t", "60", "start")
        assert r.returncode == 0, r.stderr + (self.root / "log.txt").read_text()
        return self

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)



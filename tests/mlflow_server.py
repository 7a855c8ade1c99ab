"""`mlflow server` on the loopback with a SQLite backend and its own artifact destination (served through the
server's artifact proxy, `mlflow-artifacts:`), started by a test fixture and stopped at the end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from postgres_server import free_port


def run_mlflow_server(home: Path) -> Iterator[str]:
    """Start the server in `home`, yield its URL once /health answers, stop it afterwards."""
    port = free_port()
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{home / 'server.db'}", "--artifacts-destination",
                             str(home / "artifacts"), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (home / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # its workers finish their requests first: no need to wait for them
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()

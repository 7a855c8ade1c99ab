"""A tracking server as an attacker (or a misconfigured one) would run it: MLflow's REST API, just enough for a run
to be created and logged to, answering with an artifact location of its choosing, and recording every request's
path and headers (so a test can see whose credentials it was sent)."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

API = "/api/2.0/mlflow/"


class FakeTracking:
    """`with FakeTracking(artifact_uri="file:///victim") as fake:` serves on fake.uri (127.0.0.1, a free port)."""

    def __init__(self, artifact_uri: Optional[str] = None) -> None:
        self.artifact_uri = artifact_uri  # None: mlflow-artifacts:/ of its own (a well-behaved server)
        self.by_experiment: dict[str, str] = {}  # experiment name -> the artifact location it is told
        self.requests: list[dict[str, Any]] = []
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.uri = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "FakeTracking":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def location(self, experiment: str, kind: str, ident: str) -> str:
        chosen = self.by_experiment.get(self.experiments.get(experiment, {}).get("name", experiment), self.artifact_uri)
        return f"mlflow-artifacts:/{kind}/{ident}" if chosen is None else chosen

    def headers_seen(self) -> list[dict[str, str]]:
        with self.lock:
            return [dict(r["headers"]) for r in self.requests]

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]) -> tuple[int, Any]:
        name = path.removeprefix(API)
        with self.lock:
            if name == "experiments/get-by-name":
                wanted = query.get("experiment_name", [""])[0]
                found = next((e for e in self.experiments.values() if e["name"] == wanted), None)
                if found is None:
                    return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such experiment"}
                return 200, {"experiment": found}
            if name == "experiments/create":
                ident = str(len(self.experiments) + 1)
                self.experiments[ident] = {"experiment_id": ident, "name": body.get("name", ""),
                                           "artifact_location": self.location(body.get("name", ""), "experiments",
                                                                              ident), "lifecycle_stage": "active"}
                return 200, {"experiment_id": ident}
            if name == "experiments/get":
                return 200, {"experiment": self.experiments[query["experiment_id"][0]]}
            if name == "runs/create":
                ident = f"{len(self.runs) + 1:032x}"
                self.runs[ident] = {"info": {"run_id": ident, "run_uuid": ident, "experiment_id": body["experiment_id"],
                                             "run_name": body.get("run_name", ""), "status": "RUNNING",
                                             "start_time": body.get("start_time", 0), "lifecycle_stage": "active",
                                             "artifact_uri": self.location(body["experiment_id"], "runs", ident)},
                                    "data": {"metrics": [], "params": [], "tags": body.get("tags", [])}}
                return 200, {"run": self.runs[ident]}
            if name == "runs/get":
                run = self.runs.get(query.get("run_id", [""])[0])
                return (200, {"run": run}) if run else (404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "-"})
            if name == "runs/update":
                run = self.runs[body["run_id"]]
                run["info"]["status"] = body.get("status", run["info"]["status"])
                return 200, {"run_info": run["info"]}
            if name in ("runs/log-batch", "runs/set-tag", "runs/log-parameter", "runs/log-metric"):
                return 200, {}
            return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": f"{method} {path} is not served here"}

    def _handler(self) -> type:
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                with fake.lock:
                    fake.requests.append({"method": self.command, "path": parts.path, "headers": dict(self.headers)})
                try:
                    body = json.loads(raw) if raw and raw[:1] in b"{[" else {}
                except ValueError:
                    body = {}
                status, doc = fake.answer(self.command, parts.path, parse_qs(parts.query), body)
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = _serve  # noqa: N815 - http.server's names

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

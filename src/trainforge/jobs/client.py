"""The command line's side of the JSON API (httpx).

    client = Client(server_url(None), token=None)       # --server, else $TRAINFORGE_SERVER, else http://127.0.0.1:8765
    job = client.post_job("digits_cnn", ["train.max_steps=50"], gpus=1, priority=0, max_restarts=2)
    client.jobs(); client.job(3); client.logs(3, offset=0); client.cancel(3)

Every failure is a UserError with one line: the server unreachable, a 400 (its one-line reason), a 401, a 404.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import httpx

from trainforge.errors import UserError

DEFAULT_SERVER = "http://127.0.0.1:8765"


def server_url(option: Optional[str]) -> str:
    url = option or os.environ.get("TRAINFORGE_SERVER") or DEFAULT_SERVER
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")


class Client:
    def __init__(self, url: str, token: Optional[str] = None, timeout_s: float = 600.0) -> None:
        self.url = url
        headers = {"Accept": "application/json", "X-Trainforge-Client": "cli"}  # state changes require it (CSRF)
        token = token or os.environ.get("TRAINFORGE_TOKEN")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # submissions wait for the planner's simulation: a long read timeout, a short connect timeout
        self._http = httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=5.0),
                                  trust_env=False)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self._http.request(method, path, **kwargs)
        except httpx.TransportError:
            raise UserError(f"cannot reach the trainforge server at {self.url}; start it with `trainforge server` "
                            "or pass --server") from None
        if r.status_code == 401:
            raise UserError(f"the server at {self.url} needs a token; set TRAINFORGE_TOKEN (or pass --token)")
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail")
            except ValueError:
                detail = None
            raise UserError(str(detail) if detail else f"the server answered {r.status_code} {r.reason_phrase} for {path}")
        return r.json()

    def post_job(self, recipe: str, overrides: Sequence[str], *, gpus: int = 1, priority: int = 0,
               max_restarts: int = 0) -> dict[str, Any]:
        """A local recipe file is sent as YAML text (the server never reads paths it is sent); else a built-in name."""
        body: dict[str, Any] = {"recipe": recipe, "overrides": list(overrides), "gpus": gpus, "priority": priority,
                                "max_restarts": max_restarts}
        path = Path(recipe)
        if path.is_file():
            try:
                body["recipe_yaml"] = path.read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise UserError(f"{recipe}: cannot read ({e}); check the path") from None
            body["recipe"] = path.name
        elif path.suffix in (".yaml", ".yml") or "/" in recipe:
            raise UserError(f"{recipe}: recipe file not found; give a path to a YAML file or a built-in recipe name")
        return self._call("POST", "/api/jobs", json=body)

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/jobs")

    def job(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}")

    def logs(self, job_id: int, offset: int = 0) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}/logs", params={"offset": offset})

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._call("POST", f"/api/jobs/{job_id}/cancel")

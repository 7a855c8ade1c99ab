"""The HTTP side: a JSON API (described at /openapi.json) and the dashboard (server-rendered, a little JS).

    app = create_app(service, token=None)                 # FastAPI app; the lifespan starts and stops the service
    serve(service, host="127.0.0.1", port=8765)           # uvicorn, what `trainforge server` runs

API (JSON; with a token every call needs `Authorization: Bearer <token>`):
    GET  /api/health                      {"ok", "slots"}
    GET  /api/jobs                        [job]               job: {"id", "name", "state", "gpus", "restarts", "run_dir", ...}
    POST /api/jobs                        {"recipe", "recipe_yaml"?, "overrides"?, "gpus"?, "priority"?, "max_restarts"?}
                                          -> 201 job | 400 {"detail": one line}
    GET  /api/jobs/{id}                   job + {"config_yaml", "log_path"}
    GET  /api/jobs/{id}/logs?offset=N     {"text", "offset", "state"}  (offset < 0: the last -N bytes)
    GET  /api/jobs/{id}/metrics           {"train": [...], "val": [...], "progress"}
    POST /api/jobs/{id}/cancel            job
    GET  /api/gpus                        [slot + {"reserved_bytes", "jobs", "live"}]
    GET  /api/recipes                     ["digits_cnn", ...]
Dashboard: / (jobs + submit form), /jobs/{id} (curves, log tail, config), /gpus.
"""
from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Any, Optional

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ConfigDict, Field

from trainforge.errors import UserError
from trainforge.jobs.progress import read_log, series
from trainforge.jobs.service import JobNotFound, JobService, Submission

HERE = Path(__file__).parent
COOKIE = "trainforge_token"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


class SubmitIn(BaseModel):
    """A submission: a recipe (built-in name, or any name with its YAML text) and KEY=VALUE overrides."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(..., min_length=1, max_length=500)
    recipe_yaml: Optional[str] = Field(None, max_length=1_000_000)
    overrides: list[str] = Field(default_factory=list, max_length=1000)
    gpus: int = Field(1, ge=1, le=1024)
    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    max_restarts: int = Field(0, ge=0, le=1000)


class Progress(BaseModel):
    step: int
    total_steps: Optional[int]
    fraction: Optional[float]
    eta_s: Optional[float]


class JobOut(BaseModel):
    id: int
    name: str
    state: str
    gpus: list[str]
    restarts: int
    run_dir: str
    num_gpus: int
    priority: int
    max_restarts: int
    attempt: int
    recipe: str
    overrides: list[str]
    memory_bytes: int
    reason: Optional[str]
    cancel_requested: bool
    submitted_at: float
    started_at: Optional[float]
    finished_at: Optional[float]
    pid: Optional[int]
    progress: Progress


class JobDetail(JobOut):
    config_yaml: str
    log_path: str


class LogOut(BaseModel):
    text: str
    offset: int
    state: str


class MetricsOut(BaseModel):
    train: list[dict[str, Any]]
    val: list[dict[str, Any]]
    progress: Progress


def create_app(service: JobService, *, token: Optional[str] = None, allowed_hosts: Optional[list[str]] = None,
               manage_service: bool = True) -> FastAPI:
    """The API and dashboard over `service`. token: required on every request when set. allowed_hosts: the
    Host headers accepted (a loopback-only server refuses other names, which stops DNS rebinding)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        if manage_service:
            service.start()
        try:
            yield
        finally:
            if manage_service:
                service.stop()

    # no /docs or /redoc: FastAPI's pages load their scripts from a CDN; the schema is at /openapi.json
    app = FastAPI(title="trainforge job server", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Queue training jobs on this machine's GPUs; the dashboard is at /.")
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)

    if token:
        @app.middleware("http")
        async def require_token(request: Request, call_next):
            given = request.query_params.get("token")
            if given is not None and request.method == "GET" and secrets.compare_digest(given.encode(), token.encode()):
                # the dashboard's one-time ?token=: keep it in a cookie, drop it from the address bar
                rest = request.url.remove_query_params("token")
                response = RedirectResponse(rest.path + (f"?{rest.query}" if rest.query else ""), status_code=303)
                response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return response
            header = request.headers.get("authorization", "")
            supplied = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
            if not secrets.compare_digest(supplied.encode(), token.encode()):
                return JSONResponse({"detail": "missing or wrong token: send `Authorization: Bearer <token>` "
                                               "(the dashboard: open it once with ?token=<token>)"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await call_next(request)

    @app.exception_handler(UserError)
    async def _user_error(_request: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(JobNotFound)
    async def _not_found(_request: Request, exc: JobNotFound) -> JSONResponse:
        return JSONResponse({"detail": f"job {exc.args[0]} does not exist; `trainforge jobs list` shows the jobs"},
                            status_code=404)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path"))
        return JSONResponse({"detail": f"{loc or 'request'}: {e.get('msg', 'invalid')}"}, status_code=400)

    # ------------------------------------------------------------ JSON API

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "slots": len(service.slots)}

    @app.get("/api/jobs", response_model=list[JobOut])
    def list_jobs() -> list[dict[str, Any]]:
        return [service.view(j) for j in service.store.list()]

    @app.post("/api/jobs", response_model=JobOut, status_code=201)
    async def submit(body: SubmitIn) -> dict[str, Any]:
        job = await service.submit_async(Submission(
            recipe=body.recipe, recipe_yaml=body.recipe_yaml, overrides=tuple(body.overrides), num_gpus=body.gpus,
            priority=body.priority, max_restarts=body.max_restarts))
        return service.view(job)

    @app.get("/api/jobs/{job_id}", response_model=JobDetail)
    def show(job_id: int) -> dict[str, Any]:
        return service.view(service.get(job_id), detail=True)

    @app.get("/api/jobs/{job_id}/logs", response_model=LogOut)
    def logs(job_id: int, offset: int = Query(0, description="byte offset; negative: the last -offset bytes")) -> dict[str, Any]:
        job = service.get(job_id)
        text, nxt = read_log(Path(job.log_path), offset)
        return {"text": text, "offset": nxt, "state": job.state}

    @app.get("/api/jobs/{job_id}/metrics", response_model=MetricsOut)
    def metrics(job_id: int) -> dict[str, Any]:
        job = service.get(job_id)
        return {**series(Path(job.run_dir)), "progress": service.view(job)["progress"]}

    @app.post("/api/jobs/{job_id}/cancel", response_model=JobOut)
    def cancel(job_id: int) -> dict[str, Any]:
        return service.view(service.cancel(job_id))

    @app.get("/api/gpus")
    def gpus() -> list[dict[str, Any]]:
        return service.slot_views()

    @app.get("/api/recipes")
    def recipes() -> list[str]:
        from trainforge.config import builtin_recipes

        return list(builtin_recipes())

    # ------------------------------------------------------------ dashboard

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request) -> HTMLResponse:
        from trainforge.config import builtin_recipes

        jobs = [service.view(j) for j in service.store.list()]
        return templates.TemplateResponse(request, "index.html", {"jobs": jobs, "recipes": list(builtin_recipes())})

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: int) -> HTMLResponse:
        job = service.view(service.get(job_id), detail=True)
        log_tail, _ = read_log(Path(job["log_path"]), -20000)
        return templates.TemplateResponse(request, "job.html", {"job": job, "log_tail": log_tail})

    @app.get("/gpus", response_class=HTMLResponse, include_in_schema=False)
    def gpus_page(request: Request) -> HTMLResponse:
        return templates.TemplateResponse(request, "gpus.html", {"slots": service.slot_views()})

    return app


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def serve(service: JobService, *, host: str, port: int, token: Optional[str]) -> None:
    """Run the server until Ctrl-C. Jobs keep running afterwards; a restarted server adopts them."""
    import uvicorn

    allowed = sorted({"127.0.0.1", "localhost", "[::1]", "::1", host}) if is_loopback(host) else None
    app = create_app(service, token=token, allowed_hosts=allowed)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)

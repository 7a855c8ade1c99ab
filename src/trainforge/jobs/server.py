"""The HTTP side: a JSON API (described at /openapi.json) and the dashboard (static pages, a little JS).

    app = create_app(service, token=None)                 # FastAPI app; the lifespan starts and stops the service
    serve(service, host="127.0.0.1", port=8765)           # uvicorn, what `trainforge server` runs
    server_config(app, host="127.0.0.1", port=8765)       # its uvicorn.Config: request deadlines, connection bounds

API (JSON; with a token every call needs `Authorization: Bearer <token>`):
    GET  /api/health                      {"ok", "slots", "sandboxed"}
    GET  /api/jobs                        [job]               job: {"id", "name", "state", "gpus", "restarts", "run_dir", ...}
    POST /api/jobs                        {"recipe", "recipe_yaml"?, "overrides"?, "gpus"?, "priority"?, "max_restarts"?}
                                          -> 201 job | 400 {"detail": one line} | 503 busy (retry)
    GET  /api/jobs/{id}                   job + config_yaml, log_path
    GET  /api/jobs/{id}/logs?offset=N     {"text", "offset", "state"}  (offset < 0: the last -N bytes)
    GET  /api/jobs/{id}/metrics           {"train": [...], "val": [...], "progress"}
    GET  /api/jobs/{id}/val_images.png    the run's validation picture (detection, segmentation) | 404 none yet
    POST /api/jobs/{id}/cancel            job
    GET  /api/gpus                        [slot + {"reserved_bytes", "jobs", "live"}]
    GET  /api/recipes                     ["digits_cnn", ...]
    GET  /api/compare?ids=1&ids=2         the jobs' runs compared (2 to 10): {"ids", "runs", "curves",
                                          "config_differences", "test_metrics"} (report.compare)
    GET  /api/compare.html?ids=1&ids=2    the same as `trainforge runs compare`'s self-contained page, to download
Dashboard: / (jobs + submit form; tick jobs to compare), /jobs/{id} (curves, log tail, config), /compare?ids=...,
/gpus: pages without data, filled in by their scripts from the API, so a page served without the token shows nothing.

Defences (docs/jobs.md, "Security model"): a state-changing request (any method but GET/HEAD/OPTIONS) must
carry the X-Trainforge-Client header, which a cross-site form cannot send and a cross-site script cannot
send without a CORS preflight this server never grants, and an Origin / Sec-Fetch-Site, when present, of
this server itself; request bodies are capped; a request must arrive within 10 s of its connection (or of its first
byte on a kept-alive one) and at most 128 connections may be receiving one (`jobs.connections`); every response carries a Content-Security-Policy that allows
only this origin's own scripts and styles, X-Frame-Options: DENY and X-Content-Type-Options: nosniff. The
token lives in a header only, never in a cookie (cookies are shared by every port of a host).
"""
from __future__ import annotations

import contextlib
import ipaddress
import secrets
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional
from urllib.parse import urlsplit

from fastapi import Depends, FastAPI, Path as PathParam, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator
from starlette.middleware.trustedhost import TrustedHostMiddleware

from trainforge.config import MAX_YAML_BYTES, builtin_recipes, describe_character
from trainforge.errors import HIDDEN_CATEGORIES, UserError, clip_message
from trainforge.jobs.peers import submitter
from trainforge.jobs.progress import MAX_POINTS, chart_metrics, read_log, read_picture, series
from trainforge.jobs.service import JobNotFound, JobService, Submission
from trainforge.jobs.sizing import Busy
from trainforge.jobs.store import Job
from trainforge.layout import CONFIG
from trainforge.report.runs import MAX_COMPARED

if TYPE_CHECKING:
    from trainforge.report.compare import Comparison

HERE = Path(__file__).parent
CLIENT_HEADER = "X-Trainforge-Client"  # required on state changes: a cross-site form cannot set it
MAX_BODY_BYTES = 2 * MAX_YAML_BYTES  # a recipe's text plus overrides; anything larger is refused unread
MAX_JOB_ID = 2**63 - 1
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


JobIds = Annotated[list[Annotated[int, Field(ge=1, le=MAX_JOB_ID)]], Query(  # module level: annotations are strings
    min_length=2, max_length=MAX_COMPARED, description=f"the jobs to compare, 2 to {MAX_COMPARED}: ?ids=1&ids=2")]


class SubmitIn(BaseModel):
    """A submission: a recipe (built-in name, or any name with its YAML text) and KEY=VALUE overrides."""

    model_config = ConfigDict(extra="forbid")

    recipe: str = Field(..., min_length=1, max_length=500)
    recipe_yaml: Optional[str] = Field(None, max_length=MAX_YAML_BYTES)
    overrides: list[str] = Field(default_factory=list, max_length=1000)
    gpus: StrictInt = Field(1, ge=1, le=1024)
    priority: StrictInt = Field(0, ge=-1_000_000, le=1_000_000)
    max_restarts: StrictInt = Field(0, ge=0, le=1000)

    @field_validator("recipe", mode="before")
    @classmethod
    def _plain_name(cls, v: Any) -> Any:
        hidden = next((c for c in v if unicodedata.category(c) in HIDDEN_CATEGORIES), None) if isinstance(v, str) else None
        if hidden is not None:  # shown by `jobs show` and the dashboard, and named in errors
            raise ValueError(f"{describe_character(hidden)} in the recipe's name; name it with printable characters")
        return v

    @field_validator("recipe_yaml", mode="before")
    @classmethod
    def _unicode(cls, v: Any) -> Any:
        if isinstance(v, str):  # JSON can carry a lone surrogate ("\\ud800"), which no text file holds
            at = next((i for i, c in enumerate(v) if "\ud800" <= c <= "\udfff"), None)
            if at is not None:
                raise ValueError(f"line {v.count(chr(10), 0, at) + 1}: {describe_character(v[at])}; "
                                 "send the recipe as the UTF-8 text of its file")
        return v

    @field_validator("recipe_yaml")
    @classmethod
    def _bytes(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and len(v.encode("utf-8", "surrogatepass")) > MAX_YAML_BYTES:
            raise ValueError(f"larger than {MAX_YAML_BYTES >> 10} KiB; a recipe is a few KiB of settings")
        return v

    @field_validator("overrides")
    @classmethod
    def _override_size(cls, v: list[str]) -> list[str]:
        if any(len(o) > 10_000 for o in v):
            raise ValueError("an override is longer than 10000 characters; KEY=VALUE settings are short")
        return v


class Progress(BaseModel):
    step: int
    total_steps: Optional[int]
    fraction: Optional[float]
    eta_s: Optional[float]
    unreadable: Optional[str] = None  # why the job's metrics.jsonl is not read (a FIFO, a link, a device)


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
    memory_bytes: int  # the planner's predicted peak, reserved on each of its slots
    memory_per: str  # what memory_bytes is per: "GPU" where the slots are GPUs, else "slot" (--gpus cpu:N)
    reason: Optional[str]
    cancel_requested: bool
    submitted_at: float
    started_at: Optional[float]
    finished_at: Optional[float]
    pid: Optional[int]
    progress: Progress
    backend: str  # where the job runs: local, or the cluster engine's name (slurm)
    backend_id: Optional[str]  # the engine's id of its current (or last) attempt


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
    unreadable: Optional[str] = None
    charts: list[str] = []  # the validation metrics the job page charts, in order (every registered task's, now)


def create_app(service: JobService, *, token: Optional[str] = None, allowed_hosts: Optional[list[str]] = None,
               manage_service: bool = True) -> FastAPI:
    """The API and dashboard over `service`. token: required on every API request when set. allowed_hosts:
    the Host headers accepted (a loopback-only server refuses other names, which stops DNS rebinding)."""

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
    app.state.service = service
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    # the last added runs first: guard (token, cross-site, security headers on every answer) -> host -> body size
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    if allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refusal = _refusal(request, token)
        response = refusal if refusal is not None else await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(Busy)
    async def _busy(_request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(UserError)
    async def _user_error(_request: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"detail": exc.public if isinstance(exc.public, str) else str(exc)}, status_code=400)

    @app.exception_handler(JobNotFound)
    async def _not_found(_request: Request, exc: JobNotFound) -> JSONResponse:
        return JSONResponse({"detail": f"job {exc.args[0]} does not exist; `trainforge jobs list` shows the jobs"},
                            status_code=404)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        e = exc.errors()[0]
        loc = ".".join(str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path"))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        return JSONResponse({"detail": clip_message(f"{loc or 'request'}: {msg}")}, status_code=400)

    # ------------------------------------------------------------ JSON API

    @app.get("/api/health")
    def health() -> dict[str, Any]:
        return {"ok": True, "slots": len(service.slots), "sandboxed": service.sandboxed}

    @app.get("/api/jobs", response_model=list[JobOut])
    def list_jobs() -> list[dict[str, Any]]:
        return [service.view(j) for j in service.store.list()]

    @app.post("/api/jobs", response_model=JobOut, status_code=201)
    async def submit(body: SubmitIn, who: Annotated[str, Depends(submitter_of)]) -> dict[str, Any]:
        job = await service.enqueue_async(Submission(
            recipe=body.recipe, recipe_yaml=body.recipe_yaml, overrides=tuple(body.overrides), num_gpus=body.gpus,
            priority=body.priority, max_restarts=body.max_restarts, submitter=who))
        return service.view(job)

    JobId = PathParam(..., ge=1, le=MAX_JOB_ID, description="job id")

    @app.get("/api/jobs/{job_id}", response_model=JobDetail)
    def show(job_id: int = JobId) -> dict[str, Any]:
        return service.view(service.get(job_id), detail=True)

    @app.get("/api/jobs/{job_id}/logs", response_model=LogOut)
    def logs(job_id: int = JobId, offset: int = Query(0, ge=-MAX_JOB_ID, le=MAX_JOB_ID,
                                                      description="byte offset; negative: the last -offset bytes")
             ) -> dict[str, Any]:
        job = service.get(job_id)
        text, nxt = read_log(Path(job.log_path), offset)
        return {"text": text, "offset": nxt, "state": job.state}

    @app.get("/api/jobs/{job_id}/metrics", response_model=MetricsOut)
    def metrics(job_id: int = JobId) -> dict[str, Any]:
        job = service.get(job_id)
        return {**series(Path(job.run_dir)), "progress": service.view(job)["progress"], "charts": chart_metrics()}

    @app.get("/api/jobs/{job_id}/val_images.png", response_class=Response,
             responses={200: {"content": {"image/png": {}}}, 404: {"description": "no validation picture yet"}})
    def val_images(job_id: int = JobId) -> Response:
        picture = read_picture(Path(service.get(job_id).run_dir))
        if picture is None:
            return JSONResponse({"detail": f"job {job_id} has no validation images (yet): detection and "
                                           "segmentation runs draw them at each evaluation"}, status_code=404)
        return Response(picture, media_type="image/png", headers={"Cache-Control": "no-store"})

    @app.post("/api/jobs/{job_id}/cancel", response_model=JobOut)
    def cancel(job_id: int = JobId) -> dict[str, Any]:
        return service.view(service.cancel(job_id))

    @app.get("/api/gpus")
    def gpus() -> list[dict[str, Any]]:
        return service.slot_views()

    @app.get("/api/recipes")
    def recipes() -> list[str]:
        return list(builtin_recipes())

    @app.get("/api/compare")
    def compare(ids: JobIds) -> dict[str, Any]:
        return {"ids": ids, **compare_jobs(service, ids).to_json(max_points=MAX_POINTS)}

    @app.get("/api/compare.html", response_class=HTMLResponse)
    def compare_file(ids: JobIds) -> HTMLResponse:
        from trainforge.report.compare import comparison_html  # heavy (matplotlib): the server starts without it

        return HTMLResponse(comparison_html(compare_jobs(service, ids)),
                            headers={"Content-Disposition": 'attachment; filename="compare.html"'})

    # ------------------------------------------------------------ dashboard

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request) -> HTMLResponse:
        return templates.TemplateResponse(request, "index.html", {})

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    def job_page(request: Request, job_id: int = JobId) -> HTMLResponse:
        return templates.TemplateResponse(request, "job.html", {"job_id": job_id})

    @app.get("/gpus", response_class=HTMLResponse, include_in_schema=False)
    def gpus_page(request: Request) -> HTMLResponse:
        return templates.TemplateResponse(request, "gpus.html", {})

    @app.get("/compare", response_class=HTMLResponse, include_in_schema=False)
    def compare_page(request: Request, ids: JobIds) -> HTMLResponse:
        return templates.TemplateResponse(request, "compare.html", {})

    return app


def submitter_of(request: Request) -> str:
    """Who sent this request (`peers.submitter`: a loopback client's Unix user, else its address). A plain function:
    FastAPI runs it on its thread pool, so reading the kernel's socket tables never holds up the event loop."""
    return submitter(request.scope.get("client"), request.scope.get("server"))


def compare_jobs(service: JobService, ids: list[int]) -> Comparison:
    """The comparison of these jobs' runs, each labelled "job <id>: <name>"; JobNotFound (404) for an id the server
    does not know, UserError (400) for one given twice or a job that has not started its run."""
    from trainforge.report.compare import compare_runs  # heavy (matplotlib): the server starts without it

    if len(set(ids)) != len(ids):
        raise UserError("ids: a job is listed twice; list each job once", public=True)
    jobs: list[Job] = [service.get(i) for i in ids]
    for job in jobs:
        if not (Path(job.run_dir) / CONFIG).is_file():
            raise UserError(f"ids: job {job.id} has no run yet ({job.state}); compare jobs that have started", public=True)
    return compare_runs([Path(j.run_dir) for j in jobs], labels=[f"job {j.id}: {j.name}" for j in jobs])


def _refusal(request: Request, token: Optional[str]) -> Optional[JSONResponse]:
    """Why this request must not reach a handler (401 / 403), or None."""
    path = request.url.path
    if token and (path.startswith("/api/") or path == "/openapi.json"):
        header = request.headers.get("authorization", "")
        supplied = header[7:] if header.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(supplied.encode(), token.encode()):
            return JSONResponse({"detail": "missing or wrong token: send `Authorization: Bearer <token>` (the dashboard "
                                           "asks for it once per browser tab)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
    if request.method not in SAFE_METHODS:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return _forbidden(f"a {site} request may not change anything here")
        origin = request.headers.get("origin")
        if origin is not None and not _same_origin(origin, request):
            return _forbidden("a request from another origin may not change anything here")
        if request.headers.get(CLIENT_HEADER) is None:
            return _forbidden(f"state changes need the {CLIENT_HEADER} header (the CLI and the dashboard send it)")
    return None


def _same_origin(origin: str, request: Request) -> bool:
    """`Origin` names this server: scheme, host and port as the request reached it."""
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False  # "null" (a file:// page, a sandboxed frame) and anything odd
    default = 443 if parts.scheme == "https" else 80
    host = request.headers.get("host", "")
    ours = urlsplit(f"{request.url.scheme}://{host}")
    ours_port = ours.port or (443 if request.url.scheme == "https" else 80)
    return parts.scheme == request.url.scheme and parts.hostname == ours.hostname and (parts.port or default) == ours_port


def _forbidden(why: str) -> JSONResponse:
    return JSONResponse({"detail": f"cross-site request refused: {why}"}, status_code=403)


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered 413 unread past the limit. The body is read
    here (by Content-Length or while streaming) and replayed to the app, so no handler sees a partial one."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _too_large(self.max_bytes, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away (or its request deadline passed):
                await _gone(send)  # an answer no one reads, so the middleware above sees one and logs no error
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await _too_large(self.max_bytes, send)
                return
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)


async def _too_large(max_bytes: int, send: Any) -> None:
    response = JSONResponse({"detail": f"request body larger than {max_bytes >> 10} KiB; a submission is a few KiB"},
                            status_code=413)
    await response({"type": "http"}, None, send)


async def _gone(send: Any) -> None:
    await JSONResponse({"detail": "the request did not arrive in full"}, status_code=408)({"type": "http"}, None, send)


def is_loopback(host: str) -> bool:
    """An address only this machine reaches: "localhost" or a loopback IP (127.0.0.0/8, ::1), by ipaddress."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


MAX_CONNECTIONS = 512  # open at once; past it a request is answered 503 (well under a 1024 file-descriptor limit)


def server_config(app: Any, *, host: str, port: int, request_timeout_s: Optional[float] = None,
                  max_partial: Optional[int] = None) -> Any:
    """The uvicorn.Config the server runs with (`serve`, and the tests' live server): uvicorn's h11 protocol with a
    deadline on receiving each request and a bound on connections still receiving one (`jobs.connections`:
    REQUEST_TIMEOUT_S, MAX_PARTIAL_CONNECTIONS unless given), at most MAX_CONNECTIONS connections, keep-alive
    connections closed after uvicorn's 5 idle seconds, no access log."""
    import uvicorn  # heavy (uvicorn): only serving needs it, not the app

    from trainforge.jobs.connections import MAX_PARTIAL_CONNECTIONS, REQUEST_TIMEOUT_S, deadline_protocol

    protocol = deadline_protocol(REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s,
                                 MAX_PARTIAL_CONNECTIONS if max_partial is None else max_partial)
    return uvicorn.Config(app, host=host, port=port, http=protocol, limit_concurrency=MAX_CONNECTIONS,
                          timeout_keep_alive=5, log_level="warning", access_log=False)


def serve(service: JobService, *, host: str, port: int, token: Optional[str]) -> None:
    """Run the server until Ctrl-C. Jobs keep running afterwards; a restarted server adopts them."""
    import uvicorn  # heavy (uvicorn): only serve() needs it, not the app

    allowed = sorted({"127.0.0.1", "localhost", "[::1]", "::1", host}) if is_loopback(host) else None
    server = uvicorn.Server(server_config(create_app(service, token=token, allowed_hosts=allowed), host=host, port=port))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:  # uvicorn has logged why (the port taken meanwhile, the app failing to start)
        raise UserError(f"--port: the server could not start on {host}:{port}; see the message above")

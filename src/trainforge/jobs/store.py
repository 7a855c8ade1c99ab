"""The job table (SQLAlchemy 2): SQLite in WAL mode by default, PostgreSQL by URL.

    store = Store("sqlite:///runs/server/jobs.db")          # or "postgresql+psycopg://user@host/db"
    job = store.create(name="digits_cnn", recipe="digits_cnn", ..., job_dir_for=lambda id: f"jobs/{id}")
    store.claim(job.id, ["0"])                              # queued -> running, only if still queued
    store.set_process(job.id, pid, start_ticks)
    store.requeue(job.id, "killed by SIGKILL")              # running -> queued, restarts + 1, resume next time
    store.finish(job.id, "succeeded")

State changes are conditional UPDATEs (`... WHERE state = 'queued'`), so a job is claimed once even if
two threads race. Rows come back detached (plain attribute access, no lazy loading).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from sqlalchemy import (JSON, BigInteger, Boolean, Double, Integer, String, Text, create_engine, event, inspect, select,
                        text, update)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from trainforge.errors import UserError
from trainforge.layout import JobDir

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL_STATES = ("succeeded", "failed", "cancelled")


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    recipe: Mapped[str] = mapped_column(String(1000))  # as submitted: a built-in name or the client's file name
    overrides: Mapped[list] = mapped_column(JSON, default=list)
    config_yaml: Mapped[str] = mapped_column(Text)  # the resolved config the job runs (its frozen recipe)
    num_gpus: Mapped[int] = mapped_column(Integer, default=1)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # process starts so far
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    reason: Mapped[Optional[str]] = mapped_column(Text, nullable=True)
    memory_bytes: Mapped[int] = mapped_column(BigInteger)  # planner's peak per device, reserved on each slot
    total_steps: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)
    slots: Mapped[list] = mapped_column(JSON, default=list)  # slot ids of the current (or last) attempt
    pid: Mapped[Optional[int]] = mapped_column(Integer, nullable=True)  # the job's process-group leader
    pid_start_ticks: Mapped[Optional[int]] = mapped_column(BigInteger, nullable=True)  # /proc/<pid>/stat start time
    # a cluster backend's id of the current attempt (Slurm's job id): set when the engine took the job (still
    # `queued` while the engine holds it pending), kept after it ended; None on the local backend
    backend_id: Mapped[Optional[str]] = mapped_column(String(64), nullable=True)
    resume: Mapped[bool] = mapped_column(Boolean, default=False)  # the next start passes --resume auto
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    job_dir: Mapped[str] = mapped_column(String(2000), default="")
    submitted_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[Optional[float]] = mapped_column(Double, nullable=True)
    finished_at: Mapped[Optional[float]] = mapped_column(Double, nullable=True)

    @property
    def run_dir(self) -> str:
        return str(JobDir(Path(self.job_dir)).run)

    @property
    def log_path(self) -> str:
        return str(JobDir(Path(self.job_dir)).log)


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get WAL (readers never block the writer) and a busy timeout."""
    try:
        engine = create_engine(url, future=True, pool_pre_ping=not url.startswith("sqlite"))
    except (ArgumentError, ImportError, ValueError) as e:
        raise UserError(f"--db: cannot use {url!r} ({e}); use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB") from None
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # every new connection, before first use
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL: a crash loses no committed transaction's integrity
            cur.close()
    return engine


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        try:
            Base.metadata.create_all(self.engine)
            self._add_new_columns()
        except OperationalError as e:
            raise UserError(f"--db: cannot open {self.engine.url.render_as_string(hide_password=True)} "
                            f"({str(e.orig).strip().splitlines()[0]}); check the URL and that the database is up") from None

    def _add_new_columns(self) -> None:
        """A table written by an older trainforge gets the nullable columns added since (its jobs keep their
        history): ALTER TABLE ... ADD COLUMN, which SQLite and PostgreSQL both run in place."""
        have = {c["name"] for c in inspect(self.engine).get_columns(Job.__tablename__)}
        missing = [c for c in Job.__table__.columns if c.name not in have]
        if not missing:
            return
        with self.engine.begin() as conn:
            for column in missing:
                assert column.nullable, column.name  # a new column must be nullable: old rows have no value
                kind = column.type.compile(dialect=self.engine.dialect)
                conn.execute(text(f'ALTER TABLE {Job.__tablename__} ADD COLUMN "{column.name}" {kind}'))

    def close(self) -> None:
        self.engine.dispose()

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # ------------------------------------------------------------ create and read

    def create(self, *, job_dir_for: Callable[[int], str], **fields: Any) -> Job:
        """Insert a queued job; `job_dir_for(id)` names its directory (known once the id is)."""
        with self._session() as s, s.begin():
            job = Job(state="queued", submitted_at=fields.pop("submitted_at", time.time()), restarts=0, attempt=0,
                      resume=False, cancel_requested=False, slots=[], **fields)
            s.add(job)
            s.flush()
            job.job_dir = job_dir_for(job.id)
        return job

    def get(self, job_id: int) -> Optional[Job]:
        with self._session() as s:
            return s.get(Job, job_id)

    def list(self, states: Optional[Iterable[str]] = None) -> list[Job]:
        """Jobs in submission order, optionally only those in `states`."""
        q = select(Job).order_by(Job.id)
        if states is not None:
            q = q.where(Job.state.in_(list(states)))
        with self._session() as s:
            return list(s.scalars(q))

    def queued(self) -> list[Job]:
        """Queued jobs in start order: priority (higher first), then submission order."""
        q = select(Job).where(Job.state == "queued").order_by(Job.priority.desc(), Job.id)
        with self._session() as s:
            return list(s.scalars(q))

    def running(self) -> list[Job]:
        return self.list(["running"])

    # ------------------------------------------------------------ state changes (conditional updates)

    def _update(self, job_id: int, where_states: tuple[str, ...], **values: Any) -> bool:
        with self._session() as s, s.begin():
            q = update(Job).where(Job.id == job_id, Job.state.in_(where_states)).values(**values)
            return s.execute(q).rowcount == 1

    def claim(self, job_id: int, slots: list[str], now: Optional[float] = None) -> bool:
        """queued -> running on `slots` (a new attempt); False if the job is no longer queued."""
        return self._update(job_id, ("queued",), state="running", slots=list(slots), attempt=Job.attempt + 1,
                            started_at=now or time.time(), pid=None, pid_start_ticks=None)

    def set_process(self, job_id: int, pid: int, start_ticks: Optional[int]) -> bool:
        return self._update(job_id, ("running",), pid=pid, pid_start_ticks=start_ticks)

    def requeue(self, job_id: int, reason: Optional[str], *, count_restart: bool = True, resume: bool = True) -> bool:
        """running (or, on a cluster backend, queued in the engine) -> queued: the next start resumes; a restart is
        counted unless the process never ran. The engine's id is dropped: the next attempt gets a new one."""
        values: dict[str, Any] = dict(state="queued", reason=reason, pid=None, pid_start_ticks=None, resume=resume,
                                      backend_id=None)
        if count_restart:
            values["restarts"] = Job.restarts + 1
        with self._session() as s, s.begin():
            held = (Job.state == "running") | ((Job.state == "queued") & Job.backend_id.is_not(None))
            return s.execute(update(Job).where(Job.id == job_id, held).values(**values)).rowcount == 1

    # ------------------------------------------------------------ on a cluster backend

    def dispatch(self, job_id: int, backend_id: str, reason: Optional[str] = None) -> bool:
        """A queued job handed to the engine (a new attempt): it stays queued until the engine runs it."""
        with self._session() as s, s.begin():
            q = (update(Job).where(Job.id == job_id, Job.state == "queued", Job.backend_id.is_(None))
                 .values(backend_id=backend_id, attempt=Job.attempt + 1, reason=reason, slots=[]))
            return s.execute(q).rowcount == 1

    def engine_started(self, job_id: int, nodes: list[str], now: Optional[float] = None) -> bool:
        """The engine runs the job (on `nodes`): queued -> running."""
        with self._session() as s, s.begin():
            q = (update(Job).where(Job.id == job_id, Job.state == "queued", Job.backend_id.is_not(None))
                 .values(state="running", slots=list(nodes), started_at=now or time.time(), reason=None))
            return s.execute(q).rowcount == 1

    def engine_pending(self, job_id: int, reason: Optional[str]) -> bool:
        """The engine took a running job back into its queue (a requeue after a node failure or a preemption):
        running -> queued, with the same engine id. Not a restart of ours: the engine restarts it."""
        return self._update(job_id, ("running",), state="queued", reason=reason)

    def note_reason(self, job_id: int, reason: Optional[str]) -> bool:
        """Why a queued or running job waits (the engine's reason), shown with it."""
        return self._update(job_id, ("queued", "running"), reason=reason)

    def finish(self, job_id: int, state: str, reason: Optional[str] = None, now: Optional[float] = None) -> bool:
        """queued|running -> a final state."""
        assert state in FINAL_STATES, state
        return self._update(job_id, ("queued", "running"), state=state, reason=reason, finished_at=now or time.time(),
                            pid=None, pid_start_ticks=None)

    def request_cancel(self, job_id: int) -> bool:
        """Mark a running job (or one an engine holds queued) for cancellation: it turns `cancelled` once its
        process has exited."""
        return self._update(job_id, ("running", "queued"), cancel_requested=True)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def journal_mode(store: Store) -> str:
    """SQLite's journal mode as a fresh connection sees it ('wal' by default here)."""
    with store.engine.connect() as conn:
        return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()

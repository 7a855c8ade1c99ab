"""The job table on SQLite (WAL) and on a real PostgreSQL server: create, claim, update, list, reconcile queries."""
from __future__ import annotations

import threading

import pytest

from trainforge.errors import UserError
from trainforge.jobs.store import Store, journal_mode, sqlite_url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = Store(sqlite_url(tmp_path / "jobs.db"))
    else:
        url = request.getfixturevalue("postgres_url")
        s = Store(url)
        from trainforge.jobs.store import Base

        Base.metadata.drop_all(s.engine)  # each test starts from an empty table
        Base.metadata.create_all(s.engine)
    yield s
    s.close()


def new_job(store: Store, name: str = "digits", priority: int = 0, **kw):
    fields = dict(name=name, recipe="digits_cnn", overrides=["train.max_steps=5"], config_yaml="name: digits\n",
                  num_gpus=1, priority=priority, max_restarts=2, memory_bytes=5 * 2**30, total_steps=5)
    fields.update(kw)
    return store.create(job_dir_for=lambda i: f"/state/jobs/{i}", **fields)


def test_create_get_and_list(store):
    a = new_job(store, "a")
    b = new_job(store, "b", overrides=["optim.lr=0.1", "name=x y"])
    assert (a.id, b.id) == (a.id, a.id + 1)
    got = store.get(b.id)
    assert got.state == "queued" and got.overrides == ["optim.lr=0.1", "name=x y"] and got.slots == []
    assert got.job_dir == f"/state/jobs/{b.id}" and got.run_dir == f"/state/jobs/{b.id}/run"
    assert got.memory_bytes == 5 * 2**30  # a 64-bit column: more than 2 GiB survives
    assert [j.name for j in store.list()] == ["a", "b"]
    assert store.get(999) is None


def test_queued_order_is_priority_then_id(store):
    ids = [new_job(store, f"j{p}", priority=p).id for p in (0, 3, 0, 3)]
    assert [j.id for j in store.queued()] == [ids[1], ids[3], ids[0], ids[2]]


def test_claim_is_conditional_and_counts_attempts(store):
    job = new_job(store)
    assert store.claim(job.id, ["0", "1"])
    assert not store.claim(job.id, ["2"])  # already running: a second claim loses
    got = store.get(job.id)
    assert got.state == "running" and got.slots == ["0", "1"] and got.attempt == 1 and got.started_at
    assert store.set_process(job.id, 4242, 123456789012)
    assert (store.get(job.id).pid, store.get(job.id).pid_start_ticks) == (4242, 123456789012)
    assert [j.id for j in store.running()] == [job.id]


def test_claim_races_have_one_winner(store):
    job = new_job(store)
    wins = []
    barrier = threading.Barrier(4)

    def claim():
        barrier.wait()
        wins.append(store.claim(job.id, ["0"]))

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False, False, False, True]


def test_requeue_and_finish_for_reconcile(store):
    job = new_job(store)
    store.claim(job.id, ["0"])
    store.set_process(job.id, 11, 22)
    assert store.requeue(job.id, "killed by SIGKILL")
    got = store.get(job.id)
    assert (got.state, got.restarts, got.resume, got.pid, got.reason) == ("queued", 1, True, None, "killed by SIGKILL")
    assert not store.requeue(job.id, "again")  # only a running job can be requeued
    store.claim(job.id, ["1"])
    assert store.get(job.id).attempt == 2
    # a job claimed but never started (server died in between) goes back without counting a restart
    assert store.requeue(job.id, None, count_restart=False, resume=True)
    assert store.get(job.id).restarts == 1
    store.claim(job.id, ["1"])
    assert store.request_cancel(job.id) and store.get(job.id).cancel_requested
    assert store.finish(job.id, "cancelled", "cancelled by the user")
    got = store.get(job.id)
    assert got.state == "cancelled" and got.finished_at and got.pid is None
    assert not store.finish(job.id, "failed")  # final states are final
    assert store.list(["running", "queued"]) == []
    assert [j.id for j in store.list(["cancelled"])] == [job.id]


def test_sqlite_runs_in_wal_mode(tmp_path):
    s = Store(sqlite_url(tmp_path / "jobs.db"))
    new_job(s)
    assert journal_mode(s) == "wal"
    assert (tmp_path / "jobs.db-wal").exists()
    s.close()


def test_a_bad_database_url_is_one_line(tmp_path):
    with pytest.raises(UserError, match="--db"):
        Store("nosuchdb://x")
    with pytest.raises(UserError, match="--db: cannot open"):
        Store(sqlite_url(tmp_path / "missing-dir" / "jobs.db"))


def test_a_cluster_engines_job_is_queued_until_it_runs_and_keeps_its_id(store):
    """On a cluster backend: dispatch (queued, with the engine's id, a new attempt), started (running on the
    engine's nodes), taken back by the engine (queued, the same id), ended and requeued by us (the id dropped)."""
    job = new_job(store)
    assert not store.engine_started(job.id, ["tf1"])  # not handed over yet
    assert store.dispatch(job.id, "41", "submitted")
    assert not store.dispatch(job.id, "42")  # handed over once
    got = store.get(job.id)
    assert (got.state, got.backend_id, got.attempt) == ("queued", "41", 1)
    assert store.engine_started(job.id, ["tf1"])
    got = store.get(job.id)
    assert (got.state, got.slots, got.reason) == ("running", ["tf1"], None)
    assert store.engine_pending(job.id, "requeued by the engine")
    assert (store.get(job.id).state, store.get(job.id).backend_id) == ("queued", "41")
    assert store.request_cancel(job.id)  # a job the engine holds can be cancelled while queued
    assert store.requeue(job.id, "killed")  # the engine's job ended: ours goes back without the old id
    got = store.get(job.id)
    assert (got.state, got.backend_id, got.restarts) == ("queued", None, 1)
    assert not store.requeue(job.id, "again")  # a queued job the engine does not hold cannot be requeued


def test_an_older_job_table_gets_the_new_columns_in_place(tmp_path):
    """A jobs.db written before backend_id existed: opened by this version, its rows are kept and the column added."""
    import sqlite3

    path = tmp_path / "old.db"
    Store(sqlite_url(path)).close()
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE jobs DROP COLUMN backend_id")
    con.execute("INSERT INTO jobs (name, recipe, overrides, config_yaml, num_gpus, priority, max_restarts, restarts, "
                "attempt, state, memory_bytes, slots, resume, cancel_requested, job_dir, submitted_at) VALUES "
                "('old', 'digits_cnn', '[]', 'x: 1', 1, 0, 0, 0, 1, 'succeeded', 5, '[]', 0, 0, 'jobs/1', 1.0)")
    con.commit()
    con.close()
    store = Store(sqlite_url(path))
    try:
        (old,) = store.list()
        assert (old.name, old.state, old.backend_id) == ("old", "succeeded", None)
        assert store.dispatch(new_job(store).id, "7")
    finally:
        store.close()

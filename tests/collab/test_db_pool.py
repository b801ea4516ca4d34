"""The web processes' PostgreSQL connection pool (``DB_POOL_MAX_SIZE``): a
``?wait=`` request gives its pooled connection back before it parks, so a pool far smaller than
the number of waiting clients serves them all, and the process still answers other requests."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from tests.collab.test_api_wait import _cancel, _group_size
from tests.collab.test_web_never_stalls import http
from tests.conftest import _stop, free_port, poll, start_daphne

pytestmark = pytest.mark.slow

POOL = 2


@pytest.fixture
def pooled_server(transactional_db, process_env, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the pool is psycopg's: PostgreSQL only")
    port = free_port()
    env = {**process_env, "DB_CONN_MAX_AGE": "0", "DB_POOL_MAX_SIZE": str(POOL), "DB_POOL_MIN_SIZE": "1",
           "DB_POOL_TIMEOUT": "2"}
    proc = start_daphne(env, port, tmp_path / "daphne.log")
    proc.url = f"http://127.0.0.1:{port}"
    proc.log = tmp_path / "daphne.log"
    try:
        yield proc
    finally:
        _stop(proc)


def test_waiting_clients_hold_no_pooled_connection(team, scripted_session, pooled_server):
    """Ten clients wait on an execution that does not end (no worker takes it) through a web
    process whose pool has two connections and lets a request wait 2 s for one: plain GETs and
    new turns still answer while they all wait (a waiter holding a connection, or a request holding
    one while it waits for a second, leaves the others failing after 2 s), and cancelling wakes
    every waiter with ``cancelled``."""
    _, sid = scripted_session(team.member, [{"sleep_ms": 600_000}, {"text": "never"}])
    waiters = 10
    with http(pooled_server, team.member) as client, ThreadPoolExecutor(waiters + 4) as pool:
        first = client.post(f"/api/sessions/{sid}/turns", json={"prompt": "go"})
        assert first.status_code == 202, first.text + pooled_server.log.read_text()[-3000:]
        job_id = first.json()["execution_id"]
        calls = [pool.submit(client.get, f"/api/executions/{job_id}?wait=60") for _ in range(waiters)]
        poll(lambda: _group_size(sid) >= waiters or any(c.done() for c in calls), timeout=30,
             what="the waiters to subscribe")
        assert not any(c.done() for c in calls), [c.result().text for c in calls if c.done()]
        others = [pool.submit(client.get, f"/api/sessions/{sid}") for _ in range(2)]
        others += [pool.submit(client.post, f"/api/sessions/{sid}/turns", {"prompt": f"then {i}"}) for i in range(2)]
        assert [r.result(timeout=30).status_code for r in others] == [200, 200, 202, 202], \
            [r.result().text[:300] for r in others]
        assert not any(c.done() for c in calls)

        _cancel(client, job_id)
        for call in calls:
            r = call.result(timeout=30)
            assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["waited"], r.text
    assert "PoolTimeout" not in pooled_server.log.read_text()


def test_an_exhausted_pool_answers_503_to_retry_never_500(team, scripted_session, pooled_server):
    """Both pooled connections held by admissions waiting on a lock (another client holds the
    session's row): a third request that cannot get a connection within DB_POOL_TIMEOUT is told
    503 ``database_busy`` with Retry-After — overload, not a failure — and once the lock goes the
    held admissions answer as usual."""
    import psycopg

    _, sid = scripted_session(team.member, [{"text": "ok"}])
    db = connection.settings_dict
    conninfo = dict(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"])
    holder, watcher = psycopg.connect(**conninfo), psycopg.connect(**conninfo, autocommit=True)
    try:
        holder.execute("SELECT id FROM collab_session WHERE id = %s FOR UPDATE", [sid])
        with http(pooled_server, team.member) as client, ThreadPoolExecutor(POOL + 1) as pool:
            held = [pool.submit(client.post, f"/api/sessions/{sid}/turns", {"prompt": f"held {i}"})
                    for i in range(POOL)]
            poll(lambda: _lock_waiters(watcher) >= POOL or any(h.done() for h in held), timeout=30,
                 what="the admissions to wait on the session's lock")
            assert not any(h.done() for h in held), [h.result().text for h in held if h.done()]
            busy = client.get("/api/projects")
            assert busy.status_code == 503, busy.text
            assert busy.json()["code"] == "database_busy" and busy.headers["Retry-After"] == "1"
            holder.rollback()
            assert [h.result(timeout=30).status_code for h in held] == [202] * POOL
    finally:
        holder.close()
        watcher.close()
    assert "Internal Server Error" not in pooled_server.log.read_text()


def _lock_waiters(conn) -> int:
    """Backends of this database waiting on a lock (``conn`` in autocommit: the statistics
    views keep one snapshot per transaction)."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]

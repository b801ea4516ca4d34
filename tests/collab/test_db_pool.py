"""The web processes' PostgreSQL connection pool (``DB_POOL_MAX_SIZE``, issue 15 item 1): a
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


def test_issue_15_1_waiting_clients_hold_no_pooled_connection(team, scripted_session, pooled_server):
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

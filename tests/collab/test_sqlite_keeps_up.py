"""The embedded default keeps up (docs/capacity.md, "What a waiting turn holds").

On SQLite, one worker process with the deployment's default slots runs 64 turns at once, each
writing between its model calls (tool calls that create and update todos, the events and
messages of every step). Writers queue for SQLite's one write lock (``BEGIN IMMEDIATE`` and the
busy timeout); none of them fails: every turn succeeds with all its writes, they ran side by
side, and no "database is locked" reaches a user or the worker's log. The time writers wait for
the lock is measured by ``bench/parallel.py`` (``--db sqlite``), not here.
"""

import pytest
from django.db import connection

from collab.models import Job, Todo
from tests.collab.test_turns_side_by_side import assert_ran_side_by_side, one_worker, queue_name  # noqa: F401
from tests.conftest import make_spec, open_session, step, turn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300),
              pytest.mark.skipif(connection.vendor != "sqlite", reason="the embedded default's database")]

TURNS = 64
NAP_MS = 3000  # long enough that all 64 start before the first ends, also on a loaded CI host


def todo(subject: str) -> dict:
    return {"name": "todo_create", "arguments": {"subject": subject}}


def test_sixty_four_writing_turns_in_flight_on_sqlite_all_succeed_with_no_locked_database(team, api_as, one_worker):  # noqa: F811
    owner = api_as(team.owner)
    make_spec(owner, "writer", [
        step(todo("first {{prompt}}"), todo("second {{prompt}}")),
        {"sleep_ms": NAP_MS},
        step(todo("third {{prompt}}"), {"name": "todo_list", "arguments": {}}),
        {"sleep_ms": NAP_MS},
        {"text": "wrote {{prompt}}"},
    ])
    api = api_as(team.member)
    sids = [open_session(api, "writer", title=f"writer {n}") for n in range(TURNS)]
    ids = [turn(api, sid, f"w{n}") for n, sid in enumerate(sids)]

    cluster = one_worker()
    for n, eid in enumerate(ids):
        done = api.wait(eid, timeout=180)
        assert done["status"] == "succeeded", done
        assert done["result"] == f"wrote w{n}", done

    jobs = list(Job.objects.filter(pk__in=ids))
    assert_ran_side_by_side(jobs, cluster)
    for n, sid in enumerate(sids):  # every write of every turn is there, once
        subjects = sorted(Todo.objects.filter(session_id=sid).values_list("subject", flat=True))
        assert subjects == sorted(f"{which} w{n}" for which in ("first", "second", "third")), (sid, subjects)
    log = cluster.log.read_text()
    assert "database is locked" not in log and "OperationalError" not in log, log[-3000:]

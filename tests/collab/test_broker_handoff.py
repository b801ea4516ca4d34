"""A turn reaches the worker queue with its admission (``collab.brokers.hand_to_broker``).

With the database as the broker (the embedded default) the task row is written in the
admission's own transaction: it is there before the commit's callbacks run, it rolls back with
an admission that fails, and no second write is left for after the commit. With Redis nothing
reaches the broker before the commit."""

import pytest
from django.conf import settings
from django.db import transaction
from django_q.brokers import get_broker
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from collab.models import Job, Session
from collab.services.turns import do_start_user_turn

database_broker = pytest.mark.skipif(not settings.Q_CLUSTER.get("orm"), reason="the database is the broker")
redis_broker = pytest.mark.skipif(bool(settings.Q_CLUSTER.get("orm")), reason="Redis is the broker")


def turns_in_database_broker() -> list[str]:
    """The job ids of the turn tasks in this run's broker rows."""
    rows = OrmQ.objects.filter(key=get_broker().list_key).values_list("payload", flat=True)
    return [task["args"][0] for task in map(SignedPackage.loads, rows) if task["func"].endswith("run_turn")]


@database_broker
def test_an_admitted_turns_task_is_written_in_the_admissions_transaction(team, scripted_session,
                                                                         django_capture_on_commit_callbacks):
    api, sid = scripted_session(team.member, [{"text": "hi"}])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"})
        assert r.status_code == 202, r.content
        # the task is there before anything runs after the commit, and nothing after it enqueues again
        assert turns_in_database_broker() == [r.json()["execution_id"]]
    for callback in callbacks:
        callback()
    assert turns_in_database_broker() == [r.json()["execution_id"]]


@database_broker
def test_an_admission_that_rolls_back_leaves_no_task(team, scripted_session):
    _, sid = scripted_session(team.member, [{"text": "hi"}])
    session = Session.objects.get(pk=sid)

    class Refused(Exception):
        pass

    with pytest.raises(Refused), transaction.atomic():
        do_start_user_turn(team.member, session, prompt="go")
        assert len(turns_in_database_broker()) == 1
        raise Refused
    assert turns_in_database_broker() == [] and not Job.objects.filter(session_id=sid).exists()


@redis_broker
def test_with_redis_a_turn_reaches_the_broker_only_after_its_commit(team, scripted_session,
                                                                    django_capture_on_commit_callbacks):
    api, sid = scripted_session(team.member, [{"text": "hi"}])
    broker = get_broker()
    broker.purge_queue()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
        assert broker.queue_size() == 0
    for callback in callbacks:
        callback()
    try:
        assert broker.queue_size() == 1
    finally:
        broker.purge_queue()

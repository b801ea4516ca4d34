"""Waiting in a thread for a change (``collab.realtime.changes``): ``job_output`` with
``block`` and ``wait_agent`` (and so the tool gateway) wait on the sessions' events — the Redis
channel layer with PostgreSQL here, the event log's counter on the embedded default — answer
once what they wait for is there, stop when their caller stops, and never outlast the timeout.

The waiter runs in a thread of its own (committed rows: ``transactional_db``); the test makes
the change only after the waiter has looked once, so the answer comes from being woken."""

import threading

import pytest

from collab.events import send_event_on_commit
from collab.models import Job
from collab.realtime import changes as waiting
from collab.services.execution import finish_job
from tests.collab.test_collab_tools import call, make_job, open_session, spawn  # noqa: F401 - open_session is a fixture

HANG_GUARD = 60  # seconds: far below the waits asked for (600 s), so only a wake ends them in time


class Looked:
    """Wraps the primitive's ``_answer`` to tell the test when the waiter has looked once."""

    def __init__(self, monkeypatch):
        self.once = threading.Event()
        self.times = 0
        real = waiting._answer

        def answer(check, stop):
            try:
                return real(check, stop)
            finally:
                self.times += 1
                self.once.set()

        monkeypatch.setattr(waiting, "_answer", answer)


def in_thread(fn):
    box = {}

    def run():
        from django.db import connection

        try:
            box["value"] = fn()
        except BaseException as exc:  # surfaced by the assertion below
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.django_db(transaction=True)
def test_job_output_block_answers_when_the_job_ends(team, open_session, monkeypatch):
    """``job_output(block=True, timeout=600000)``: the call answers with the result once
    the job ends — woken by the job's end, long before its 10-minute timeout."""
    looked = Looked(monkeypatch)
    a = open_session()
    helper = spawn(a, "w", description="helper")
    running = make_job(a.sid, helper, caller_session=a.sid, status="running", result="")

    thread, box = in_thread(lambda: call(a.api, a.address, "job_output", job_id=running.pk, timeout=600_000))
    assert looked.once.wait(HANG_GUARD), "the waiter never looked"
    assert thread.is_alive()  # it is waiting: the job still runs
    finish_job(Job.objects.get(pk=running.pk), status="succeeded", final_text="the answer is 42",
               result_text="the answer is 42")
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), "job_output went on waiting after the job ended"
    assert "error" not in box, box
    got = box["value"]
    assert not got["is_error"] and got["text"] == "the answer is 42", got
    assert got["details"]["done"] is True and got["details"]["status"] == "succeeded", got


@pytest.mark.django_db(transaction=True)
def test_the_wait_ends_when_its_caller_stops(team, open_session, monkeypatch):
    """A waiter whose caller stops (its turn cancelled: an event in its session) ends at once,
    with what it waited for still missing."""
    looked = Looked(monkeypatch)
    a = open_session()
    stopped = threading.Event()

    def wait():
        return waiting.wait_for_change(lambda: False, 600, sessions=[a.sid], stop=stopped.is_set)

    thread, box = in_thread(wait)
    assert looked.once.wait(HANG_GUARD), "the waiter never looked"
    stopped.set()
    from django.db import transaction

    with transaction.atomic():
        send_event_on_commit(a.sid, "execution.cancel_requested", {"job": "x"})
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), "the wait went on after its caller stopped"
    assert box == {"value": False}, box


@pytest.mark.django_db(transaction=True)
def test_the_wait_is_bounded_by_its_timeout(team, open_session):
    """Nothing happens: the wait gives up after its timeout with the condition's last value."""
    a = open_session()
    checks = []

    def check():
        checks.append(1)
        return None

    assert waiting.wait_for_change(check, 0.2, sessions=[a.sid]) is None
    assert checks  # it looked at least once

"""The web process's CPU per turn: each HTTP request's sync code runs on a thread
lent for the request and kept for the next one (``collab.infra.request_threads``), instead of a thread
started, and joined by another new thread, for every request — never two requests on one thread
at once, and a parked ``?wait=`` request holds none."""

import asyncio
import io
import threading

import pytest
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.core.signals import request_started

from collab.realtime.threads import release_request_thread, retake_request_thread
from collab.infra.request_threads import SCOPE_KEY, RequestThread, RequestThreads

SCOPE = {"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": [], "root_path": ""}


async def _get(app, path: str) -> tuple[int, bytes]:
    """One GET through an ASGI ``app``: the status and the body."""
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # no disconnect while the request runs

    async def send(message):
        sent.append(message)

    scope = {**SCOPE, "path": path, "headers": [(b"host", b"localhost")], "server": ("localhost", 80),
             "client": ("127.0.0.1", 1), "scheme": "http", "asgi": {"version": "3.0"}, "http_version": "1.1"}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def _idle(wrapped, n: int) -> bool:
    """Whether ``wrapped`` holds ``n`` idle threads within a second (a thread goes back to the
    free list from its own thread, once idle)."""
    for _ in range(1000):
        if len(wrapped.idle) == n:
            return True
        threading.Event().wait(0.001)
    return False


class Sink:
    """An ASGI ``send`` that drops the messages; the test apps leave what they saw on it."""

    async def __call__(self, message):
        pass


async def _until(event: threading.Event) -> None:
    """Until ``event`` (set from a request's thread or task) is set, without blocking the loop."""
    while not event.is_set():
        await asyncio.sleep(0.001)


def _request_threads():
    return [t for t in threading.enumerate() if t.name.startswith("trellis-request")]


def test_sequential_requests_run_on_one_kept_thread_through_the_application():
    """Through ``config.asgi.application`` (what daphne serves): Django's sync work of five
    requests one after another (its ``request_started`` receivers, a sync view) runs on lent
    request threads that are still there for the next request — not on a thread per request."""
    from config.asgi import application

    seen = []

    def record(**kwargs):
        seen.append(threading.current_thread())

    request_started.connect(record, weak=False)
    try:
        async def five():
            return [await _get(application, "/api/openapi.json") for _ in range(5)]

        answers = asyncio.run(five())
    finally:
        request_started.disconnect(record)
    assert [status for status, _ in answers] == [200] * 5
    # a thread goes back from itself once idle, so a request right behind may find it not back
    # yet and be lent another: at most two, each a kept request thread, never one per request
    assert len(seen) == 5 and len(set(seen)) <= 2, seen
    assert all(t.name.startswith("trellis-request") and t.is_alive() and t in _request_threads() for t in seen)


def test_concurrent_requests_never_share_a_thread_and_each_keeps_its_own():
    """Two requests at once get two threads; each request's sync calls all run on its own one."""
    first_in, release = threading.Event(), asyncio.Event()

    async def app(scope, receive, send):
        one = await sync_to_async(threading.current_thread)()
        if scope["path"] == "/a":
            first_in.set()
            await release.wait()
        two = await sync_to_async(threading.current_thread)()
        send.threads = (one, two)

    wrapped = RequestThreads(app)

    async def both():

        a, b = Sink(), Sink()
        task = asyncio.get_running_loop().create_task(wrapped({**SCOPE, "path": "/a"}, None, a))
        await _until(first_in)
        await wrapped({**SCOPE, "path": "/b"}, None, b)  # while /a is still in flight
        release.set()
        await task
        return a.threads, b.threads

    (a1, a2), (b1, b2) = asyncio.run(both())
    assert a1 is a2 and b1 is b2
    assert a1 is not b1
    assert _idle(wrapped, 2)  # both kept for later requests


def test_a_parked_request_gives_its_thread_back_for_others_to_use():
    """``release_request_thread`` (before a ``?wait=`` parks) hands the lent thread back at once:
    a request arriving while the first is parked runs on that same thread, and the parked one's
    sync code after its wait runs on another thread, never on the one now lent to someone else."""
    parked, resume = threading.Event(), asyncio.Event()

    async def app(scope, receive, send):
        before = await sync_to_async(threading.current_thread)()
        if scope["path"] == "/wait":
            await release_request_thread(ASGIRequest(scope, io.BytesIO(b"")))
            parked.set()
            await resume.wait()
        after = await sync_to_async(threading.current_thread)()
        send.threads = (before, after)

    wrapped = RequestThreads(app)

    async def run():

        waiting, other = Sink(), Sink()
        task = asyncio.get_running_loop().create_task(wrapped({**SCOPE, "path": "/wait"}, None, waiting))
        await _until(parked)
        assert await asyncio.to_thread(_idle, wrapped, 1)  # given back while still parked
        await wrapped({**SCOPE, "path": "/other"}, None, other)
        resume.set()
        await task
        return waiting.threads, other.threads

    (w_before, w_after), (o_before, o_after) = asyncio.run(run())
    assert o_before is w_before and o_after is w_before  # the parked request's thread, lent again
    assert w_after is not w_before  # after its wait the parked one ran elsewhere
    assert not w_after.name.startswith("trellis-request")


def test_at_most_the_kept_number_of_threads_stay_idle():
    """A burst past the bound makes threads for it, and shuts down what is past the bound when
    those requests end: the process does not keep a thread per request it once held at once."""
    wrapped = RequestThreads(None, keep=2)
    lent = [wrapped.borrow() for _ in range(5)]
    assert all(isinstance(e, RequestThread) for e in lent) and len({id(e) for e in lent}) == 5
    for executor in lent:
        executor.give_back()
        assert _idle(wrapped, min(2, lent.index(executor) + 1))
    assert wrapped.idle == lent[:2]
    for executor in lent[2:]:
        with pytest.raises(RuntimeError):  # shut down: it takes no more work
            executor.submit(int)
    assert wrapped.borrow() is lent[1]


def test_a_request_back_from_its_wait_is_lent_a_thread_again():
    """After its wait (``retake_request_thread``) a request's sync code runs on a lent thread
    again — not the one lent meanwhile to a request still in flight, and not a thread started for
    it — and that thread too goes back to the free list when the request ends."""
    parked, resume, other_in, other_done = threading.Event(), asyncio.Event(), threading.Event(), asyncio.Event()

    async def app(scope, receive, send):
        assert scope[SCOPE_KEY] is wrapped
        before = await sync_to_async(threading.current_thread)()
        if scope["path"] == "/wait":
            request = ASGIRequest(scope, io.BytesIO(b""))
            await release_request_thread(request)
            parked.set()
            await resume.wait()
            retake_request_thread(request)
        else:
            other_in.set()
            await other_done.wait()  # still in flight while the first one comes back
        after = await sync_to_async(threading.current_thread)()
        send.threads = (before, after)

    wrapped = RequestThreads(app)

    async def run():

        waiting, other = Sink(), Sink()
        loop = asyncio.get_running_loop()
        first = loop.create_task(wrapped({**SCOPE, "path": "/wait"}, None, waiting))
        await _until(parked)
        assert await asyncio.to_thread(_idle, wrapped, 1)  # given back (once idle) while parked
        second = loop.create_task(wrapped({**SCOPE, "path": "/other"}, None, other))
        await _until(other_in)
        resume.set()
        await first
        other_done.set()
        await second
        return waiting.threads, other.threads

    (w_before, w_after), (o_before, o_after) = asyncio.run(run())
    assert o_before is w_before and o_after is w_before
    assert w_after is not w_before and w_after.name.startswith("trellis-request")
    assert _idle(wrapped, 2)


def test_a_cancelled_request_s_thread_is_lent_again_only_once_its_call_has_ended():
    """A request whose task is cancelled while its sync call still runs (daphne gives up on an
    app still running after its client left; a shutdown) does not hand the busy thread to the
    next request: that one runs on another thread at once, and the busy one goes back to the free
    list only when its call ends."""
    started, finish = threading.Event(), threading.Event()

    def slow():
        started.set()
        finish.wait(10)
        return threading.current_thread()

    async def app(scope, receive, send):
        if scope["path"] == "/slow":
            await sync_to_async(slow)()
        send.thread = await sync_to_async(threading.current_thread)()

    wrapped = RequestThreads(app)

    async def run():

        task = asyncio.get_running_loop().create_task(wrapped({**SCOPE, "path": "/slow"}, None, Sink()))
        await _until(started)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        nxt = Sink()
        await asyncio.wait_for(wrapped({**SCOPE, "path": "/next"}, None, nxt), 5)
        return nxt.thread

    try:
        thread = asyncio.run(run())
        assert thread.name.startswith("trellis-request")
        assert _idle(wrapped, 1)  # the next request's, given back; the busy one is not in the list
        busy = [t for t in _request_threads() if t is not thread]
        assert busy and all(t.is_alive() for t in busy)
    finally:
        finish.set()
    assert _idle(wrapped, 2)  # the cancelled request's thread, idle again, is back

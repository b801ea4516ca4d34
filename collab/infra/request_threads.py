"""Request threads kept between requests (to cut the web process's CPU per turn).

Django's ASGI handler runs each request's sync code (signal receivers, authentication, sync
middleware, the response's ``close``) on a thread of the request's own: asgiref's
``ThreadSensitiveContext`` makes a one-thread executor for every request, and joins its thread
in yet another new thread when the request ends — two threads started per request, about 9 % of
the web process's CPU under ``POST /turns`` (py-spy). ``RequestThreads`` lends each HTTP request
a one-thread executor from a free list instead and takes it back when the request ends, as a
threaded WSGI server reuses its threads: one request at a time on a thread, never two at once.

What the request leaves on its thread is what a WSGI thread keeps between requests: Django closes
(or hands back to the pool) the thread's database connections at ``request_finished``, which runs
on that thread as the response closes; everything else per request lives in context variables.
A request that parks (``collab.realtime.threads.release_request_thread``) gives its thread back before it
waits (``release_thread``) and is lent one again when the wait ends (``retake_thread``).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync, ThreadSensitiveContext
from django.conf import settings
from django.db import close_old_connections


class RequestThread(ThreadPoolExecutor):
    """One request's thread: a one-thread executor that goes back to its ``RequestThreads``."""

    def __init__(self, owner: "RequestThreads"):
        super().__init__(max_workers=1, thread_name_prefix="trellis-request")
        self.owner = owner

    def give_back(self) -> None:
        """Back to the free list once idle: a request whose task was cancelled (daphne gives up
        on an app still running after the client left; a shutdown) may leave its sync call still
        running here, and the next request must not be lent a thread busy with it. Whatever that
        call left open is closed first, as ``request_finished`` would have."""
        self.submit(close_old_connections).add_done_callback(lambda _: self.owner.give_back(self))


# Idle threads kept to be lent again. Steady load needs as many as requests run sync code at
# once (the concurrent bench: about its clients); a burst past it makes threads that are shut down
# when their requests end, so a process does not keep a thread per request it once held at once.
IDLE_KEPT = 16


class RequestThreads:
    """ASGI middleware for HTTP: each request's thread-sensitive sync code runs on a thread lent
    for the request (kept idle afterwards, at most ``keep`` of them)."""

    def __init__(self, app, keep: int = IDLE_KEPT):
        self.app, self.keep = app, keep
        self.idle: list[RequestThread] = []
        self.lock = threading.Lock()

    def borrow(self) -> RequestThread:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return RequestThread(self)

    def give_back(self, executor: RequestThread) -> None:
        with self.lock:
            if len(self.idle) < self.keep:
                self.idle.append(executor)
                return
        executor.shutdown(wait=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        executors = SyncToAsync.context_to_thread_executor
        async with ThreadSensitiveContext() as context:  # the outer-most: Django's own then adds none
            if _context() is not context:
                return await self.app(scope, receive, send)  # inside another context: that one decides
            executors[context] = self.borrow()
            try:
                await self.app({**scope, SCOPE_KEY: self}, receive, send)
            finally:
                # the thread lent to the request now (a parked request's was given back when it
                # parked): back to the free list; anything else asgiref made for the context
                # since is shut down by the context's exit, as before
                executor = executors.get(context)
                if isinstance(executor, RequestThread):
                    del executors[context]
                    executor.give_back()


SCOPE_KEY = "trellis.request_threads"


def _context():
    return SyncToAsync.thread_sensitive_context.get(None)


def release_thread() -> None:
    """The current request's thread back (before it parks on a long wait): a lent one to be lent
    again, any other shut down. Its sync code until ``retake_thread`` must not need the thread:
    asgiref would make a new one for it."""
    context = _context()
    if context is None or getattr(context, "_executor", None) is not None or "request_threads" in settings.TRELLIS_STOCK:
        return  # no request context, one whose executor its owner keeps, or the stock path
    executor = SyncToAsync.context_to_thread_executor.pop(context, None)
    if isinstance(executor, RequestThread):
        executor.give_back()
    elif executor is not None:
        executor.shutdown(wait=False)


def retake_thread(scope) -> None:
    """A thread lent again to the current request after its wait (when it is served through
    ``RequestThreads`` and holds none), for the sync code that ends it (Django closes the response
    on it) — instead of a thread asgiref would start for it, and join in another."""
    owner, context = scope.get(SCOPE_KEY), _context()
    if owner is not None and context is not None and context not in SyncToAsync.context_to_thread_executor:
        SyncToAsync.context_to_thread_executor[context] = owner.borrow()

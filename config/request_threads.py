"""Request threads kept between requests (issue 15 item 1: the web process's CPU per turn).

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
A request that parks (``collab.awaiting.release_request_thread``) gives its thread back before it
waits; any sync call after the wait gets a thread of its own, as before.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync, ThreadSensitiveContext


class RequestThread(ThreadPoolExecutor):
    """One request's thread: a one-thread executor that goes back to its ``RequestThreads``."""

    def __init__(self, owner: "RequestThreads"):
        super().__init__(max_workers=1, thread_name_prefix="trellis-request")
        self.owner = owner

    def give_back(self) -> None:
        self.owner.give_back(self)


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
            if SyncToAsync.thread_sensitive_context.get(None) is not context:
                return await self.app(scope, receive, send)  # inside another context: that one decides
            executor = executors[context] = self.borrow()
            try:
                await self.app(scope, receive, send)
            finally:
                # still the request's (not given back by a parked request): back to the free list;
                # whatever asgiref made for the context since is shut down by its exit, as before
                if executors.get(context) is executor:
                    del executors[context]
                    executor.give_back()

"""What a waiting request holds: under ASGI, neither its thread nor its database connection.

A route that waits (``?wait=``, a foreground gateway call) does its database work in a thread
that gives its connection back when done (``in_thread``), lets its own thread go for the wait
(``release_request_thread``) and takes one back after it (``retake_request_thread``); short
reads during the wait run on asgiref's shared executor (``briefly``). A pool thread that
outlives its work closes its connections (``closing``).
"""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections

from collab.infra.request_threads import release_thread, retake_thread


async def give_back_request_connection(request) -> None:
    """Under ASGI: close the database connection of the request's own thread (authentication and
    middleware opened it) before the request's work runs in another thread, so that a request holds
    one connection at a time. With the web processes' pool (``DB_POOL_MAX_SIZE``) a request holding
    one pooled connection while its other thread waits for a second deadlocks the pool once as many
    such requests arrive together as it has connections (seen with 10 ``?wait=`` clients on a pool
    of 2); without the pool it kept a PostgreSQL connection open for the whole of a blocking call.
    Once per request: nothing runs on that thread afterwards, and a later hop would only bring back
    the thread a ``?wait=`` gave up before it parked (``release_request_thread``)."""
    if isinstance(request, ASGIRequest) and not getattr(request, "_trellis_connection_given_back", False):
        request._trellis_connection_given_back = True
        await sync_to_async(connections.close_all)()


def closing(fn):
    """``fn`` that closes its thread's database connections when it returns: for work on a thread
    that outlives it (a pool's), which must not keep a connection while idle."""
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the thread is given back: so is its connection
    return run


async def in_thread(request, fn, *args, **kwargs):
    """Run sync database work for an async route. Under ASGI on the request's own thread (where
    authentication ran: its connection serves the work too), which then closes its connections
    (nothing is held across a wait) — or, once the request has given its thread up for a wait
    (``release_request_thread``), on a thread of the shared pool that closes its connections when
    done; under WSGI and Django's test client on the request's own thread (and its connection and
    transaction)."""
    if not isinstance(request, ASGIRequest):
        return await sync_to_async(fn)(*args, **kwargs)
    if getattr(request, "_trellis_thread_released", False):
        return await briefly(fn, *args, **kwargs)
    try:
        return await sync_to_async(closing(fn))(*args, **kwargs)
    finally:
        request._trellis_connection_given_back = True  # closed by closing, on that thread


async def briefly(fn, *args, **kwargs):
    """Short sync database work from a coroutine that holds no thread (a parked wait): on a thread
    of asgiref's shared executor, which closes its connections when done — never queued behind
    long blocking work (the gateway's pool of tool calls)."""
    return await sync_to_async(closing(fn), thread_sensitive=False)(*args, **kwargs)


async def release_request_thread(request) -> None:
    """Before a long wait under ASGI: close the database connection of the request's own
    thread (authentication and middleware ran there) and let that thread go. Django gives each
    ASGI request a thread of its own for sync code (asgiref's thread-sensitive context; lent by
    ``collab.infra.request_threads``) that would otherwise idle — with its connection — until the
    request ends; a lent thread goes back to be lent again. Sync work during the wait runs on
    the shared pool (``in_thread``); ``retake_request_thread`` ends the wait. When ``in_thread``
    has already closed that connection, no hop to the thread is needed for it."""
    if not isinstance(request, ASGIRequest):
        return
    if not getattr(request, "_trellis_connection_given_back", False):
        await give_back_request_connection(request)
    request._trellis_thread_released = True
    release_thread()


def retake_request_thread(request) -> None:
    """After a wait: the request's sync code runs on a lent thread again (``retake_thread``)."""
    if isinstance(request, ASGIRequest) and getattr(request, "_trellis_thread_released", False):
        retake_thread(request.scope)
        request._trellis_thread_released = False



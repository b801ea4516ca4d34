"""The one wait primitive: poll a condition until it holds, the caller stops, or time runs out.

Waiting tools (``job_output`` with ``block``, ``wait_agent``) can wait for minutes. While
they sleep between polls they hold no database connection (P-SEC-4): the thread's
connection is closed and the next poll opens a new one, so a thousand waiters cost no
connections and a gateway call parked in a web process pins nothing. Inside a transaction
the connection is kept (closing it would end the transaction).
"""

import time
from typing import TypeVar
from collections.abc import Callable

from django.db import connection

T = TypeVar("T")

POLL_FIRST_SECONDS = 0.05
POLL_MAX_SECONDS = 0.5


def release_connection() -> None:
    """Give this thread's database connection back, unless a transaction is open on it."""
    if not connection.in_atomic_block:
        connection.close()


def wait_until(check: Callable[[], T], timeout_seconds: float, *, stop: Callable[[], object] | None = None) -> T:
    """Call ``check`` until it returns something truthy (returned at once), ``stop()`` is truthy
    (or raises), or ``timeout_seconds`` pass; then return ``check``'s last value. Polls back off
    from 50 ms to 0.5 s."""
    deadline = time.monotonic() + timeout_seconds
    interval = POLL_FIRST_SECONDS
    while True:
        value = check()
        if value or (stop is not None and stop()):
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            return value
        release_connection()
        time.sleep(min(interval, left))
        interval = min(interval * 1.5, POLL_MAX_SECONDS)

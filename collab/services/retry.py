"""Retrying a transaction that the database aborted to break a deadlock.

Transactions that touch two sessions (a delivery from S to T, a follow-up from T
back to S) can meet in opposite lock order; PostgreSQL then aborts one of them
(SQLSTATE 40P01/40001). The whole transaction rolled back, so running it again is
safe. Only the outermost transaction may retry: inside an outer ``atomic`` the
error propagates to whoever owns that transaction.
"""

import functools
import random
import time

from django.db import OperationalError, connection

RETRYABLE_SQLSTATES = {"40P01", "40001"}
ATTEMPTS = 4


def _retryable(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES or "database is locked" in str(exc)


def retry_on_deadlock(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for attempt in range(ATTEMPTS):
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                if connection.in_atomic_block or attempt == ATTEMPTS - 1 or not _retryable(exc):
                    raise
                time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))
        raise AssertionError("unreachable")

    return wrapper

"""A thread that waits on something other than the database gives its connection back.

A turn waiting on its model, a ``sleep_ms``, a tool's process or another turn holds no database
connection (``idle_connection``; with psycopg's pool, PostgreSQL's default, it goes back to the
pool); a wait on the event log (``collab.realtime.changes``) closes its thread's connection
between reads (``release_connection``).
"""

from django.db import connection


def release_connection() -> None:
    """Give this thread's database connection back, unless a transaction is open on it."""
    if not connection.in_atomic_block:
        connection.close()


def is_pooled() -> bool:
    """Whether this process's connections come from a pool (psycopg's: PostgreSQL's default)."""
    return bool(connection.settings_dict.get("OPTIONS", {}).get("pool"))


def idle_connection() -> None:
    """This thread is about to wait on something other than the database (a model call, a sleep,
    a tool's process): its connection goes back to the pool, unless a transaction is open on it.
    Without a pool (SQLite; PostgreSQL with ``DB_POOL_MAX_SIZE=0``) the connection is kept, as
    ``CONN_MAX_AGE`` says: closing it would only cost a new one at the next query."""
    if is_pooled():
        release_connection()

"""A new database's first statistics, taken as soon as its turn tables hold a few pages.

PostgreSQL plans a prepared statement once for all its values (a generic plan) and keeps the plan
until the table's statistics change. The web and worker processes prepare their hot statements
in their first turns, when a fresh deployment's tables are nearly empty and have never been
analyzed: every index then looks as cheap as any other, and the plans chosen found the claimed
job among all queued ones, counted a project's running jobs through all of its jobs and read a
branch's whole history to find its open job. Each read grows with the table, at every turn,
until autovacuum's first ANALYZE of it (it waits for 50 rows and 10 % more, and wakes once a
minute): a 1,500-turn burst on a fresh database (``bench/turns.py``) read ~2,000 index entries
per claim.

``analyze_new_tables`` ANALYZEs the turn tables that have never been analyzed once they hold
``TRELLIS_FIRST_ANALYZE_KB`` of rows: the plans made before are dropped (an ANALYZE invalidates
them in every connection) and made again with the rows' real proportions. From then on
autovacuum keeps them. Each worker's reconciler calls it (every ``TRELLIS_RECONCILE_SECONDS``)
until every such table has been analyzed, then asks no more; it tries each table once (a table
it may not ANALYZE is left to autovacuum). A no-op on SQLite.
"""

import logging

from django.conf import settings
from django.db import connection

from collab.models import Branch, Event, Job, Message, Session

log = logging.getLogger(__name__)

TURN_TABLES = (Job, Message, Event, Branch, Session)
_done = False
_tried: set[str] = set()  # once each per process: a user that may not ANALYZE a table is warned once


def analyze_new_tables() -> list[str]:
    """ANALYZE the turn tables never analyzed that hold ``TRELLIS_FIRST_ANALYZE_KB`` or more;
    returns their names."""
    global _done
    if _done or connection.vendor != "postgresql":
        return []
    tables = [model._meta.db_table for model in TURN_TABLES]
    with connection.cursor() as cursor:
        # reltuples is -1 until the first VACUUM or ANALYZE of the table (PostgreSQL 14+)
        cursor.execute(
            "SELECT relname, pg_relation_size(oid) FROM pg_class "
            "WHERE relname = ANY(%s) AND relkind = 'r' AND relnamespace = to_regnamespace(current_schema()) "
            "AND reltuples < 0",
            [tables],
        )
        new = cursor.fetchall()
        if not new:
            _done = True
            return []
        due = [name for name, size in new if size >= settings.TRELLIS_FIRST_ANALYZE_KB * 1024 and name not in _tried]
        _tried.update(due)
        if due:
            quote = connection.ops.quote_name
            cursor.execute("ANALYZE " + ", ".join(quote(name) for name in due))
            log.info("first statistics of %s", ", ".join(due))
    return due

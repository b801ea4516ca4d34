"""A new database's turn tables are analyzed by the reconciler once they hold a few pages
(collab/services/statistics.py): the generic plans prepared on their first rows are
made again with real proportions instead of reading more rows at every turn as the tables grow."""

import pytest
from django.db import connection

from collab.services import statistics
from collab.services.reconcile import reconcile

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's statistics and plans"),
    pytest.mark.django_db(transaction=True),
]


def _never_analyzed(table):
    """As a fresh database's table (reltuples is -1 until the first VACUUM or ANALYZE)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pg_class SET reltuples = -1 WHERE oid = %s::regclass", [table])


def _reltuples(table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])
        return cursor.fetchone()[0]


def test_the_reconciler_analyzes_a_new_turn_table_once_it_holds_enough(settings, monkeypatch):
    monkeypatch.setattr(statistics, "_done", False)
    monkeypatch.setattr(statistics, "_tried", set())
    for table in ("collab_job", "collab_message", "collab_event", "collab_branch", "collab_session"):
        _never_analyzed(table)
    settings.TRELLIS_FIRST_ANALYZE_KB = 10**6  # more than any table holds: nothing is due yet
    assert reconcile()["analyzed"] == []
    assert _reltuples("collab_job") < 0
    settings.TRELLIS_FIRST_ANALYZE_KB = 0
    analyzed = reconcile()["analyzed"]
    assert set(analyzed) == {"collab_job", "collab_message", "collab_event", "collab_branch", "collab_session"}
    assert _reltuples("collab_job") >= 0
    assert reconcile()["analyzed"] == [] and statistics._done  # all analyzed: it asks no more
    monkeypatch.setattr(statistics, "_done", False)
    _never_analyzed("collab_job")  # as if its ANALYZE had been refused: it is not tried again
    assert reconcile()["analyzed"] == [] and not statistics._done
    monkeypatch.setattr(statistics, "_done", True)
    _never_analyzed("collab_job")
    assert reconcile()["analyzed"] == []  # (a process that saw them all analyzed)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE collab_job")  # as the other tests found it

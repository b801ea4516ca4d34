"""Reading a branch's history without re-serializing it."""

from django.db import connection

from collab.models import Message

_CHAIN_SQL = """
WITH RECURSIVE chain(id, predecessor_id, n) AS (
    SELECT id, predecessor_id, 1 FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, c.n + 1 FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE %s = 0 OR c.n < %s
)
SELECT id FROM chain
"""


def lineage_ids(tip_id: str, limit: int = 0) -> list[str]:
    """Ids from ``tip_id`` back towards the root (newest first), at most ``limit`` (0 = all)."""
    with connection.cursor() as cursor:
        cursor.execute(_CHAIN_SQL, [tip_id, limit, limit])
        return [row[0] for row in cursor.fetchall()]


def lineage(tip: Message | None, limit: int = 0) -> list[Message]:
    """The messages from the root (or the last ``limit``) to ``tip``, oldest first."""
    if tip is None:
        return []
    ids = lineage_ids(tip.pk, limit)
    return list(Message.objects.filter(pk__in=ids).order_by("depth"))

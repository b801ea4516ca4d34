"""Full-text search over messages (docs/web-app.md#search): an index the turn's INSERT keeps up by
itself, with no statement more on the turn's path and no column more in the row.

What is searched, on both databases: a message's text and the string values of its tool calls
(the tool's name and its arguments' values, not the JSON's keys), at most 100,000 characters of
each, cut into words at every character that is not a letter or a digit, lowercased, neither
stemmed nor stripped of common words; a query's words match words that start with them.

- PostgreSQL: ``collab_message_search_document(text, tool_calls, created_at)``, an immutable SQL
  function (inlined by the planner) giving that ``simple`` tsvector, plus two words no text can
  hold (a text's ``_`` is a separator): ``_dN``, the day it was written (N days after 2000-01-01,
  UTC), and ``_mN``, its month (year × 12 + month − 1). A search asks for a query's words and
  the last days' or months' word first, so the index finds the newest matches without reading the
  older ones (collab/selectors/search.py). ``message_search`` is a GIN index on it — an
  expression index, no trigger and no stored tsvector — built ``CONCURRENTLY`` (turns keep
  writing meanwhile; so this migration is not atomic) with a small pending list
  (``gin_pending_list_limit`` 256 kB): an INSERT appends its words there, and the one that fills
  it merges the list into the index, a bounded pause instead of a 4 MB one.
- SQLite: ``collab_message_fts``, a contentless FTS5 table (``unicode61``, diacritics kept, as
  PostgreSQL keeps them) — the text is not stored twice — whose rowid is the message's id, 12
  hex digits, read as a number (a rebuilt ``collab_message`` renumbers its own rowids, never
  these), kept up by triggers on ``collab_message`` (insert, delete, a change of text or tool
  calls; a message is written once); the messages already there are indexed here. A later
  migration that rebuilds ``collab_message`` on SQLite drops its triggers and calls
  ``restore_search_triggers`` after, both ways (as 0018 does for the job transition guard).
"""

from django.db import migrations, transaction

MAX_CHARS = 100_000  # of the text, and of the tool calls' strings: past them a message is not searched

POSTGRES_FUNCTION = rf"""
CREATE OR REPLACE FUNCTION collab_message_search_document(body text, calls jsonb, written timestamptz)
RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT to_tsvector('simple'::regconfig, regexp_replace(
    left(coalesce(body, ''), {MAX_CHARS}) || ' ' || regexp_replace(left(coalesce(
        jsonb_path_query_array(calls, 'strict $.** ? (@.type() == "string")')::text, ''), {MAX_CHARS}),
        '\\[nrt]', ' ', 'g'),
    '[[:punct:]]+', ' ', 'g'))
|| array_to_tsvector(ARRAY[
    '_d' || ((written AT TIME ZONE 'UTC')::date - date '2000-01-01')::text,
    '_m' || (date_part('year', written AT TIME ZONE 'UTC') * 12
             + date_part('month', written AT TIME ZONE 'UTC') - 1)::int::text])
$$
"""
POSTGRES_INDEX = """
CREATE INDEX CONCURRENTLY message_search ON collab_message
USING gin (collab_message_search_document(text, tool_calls, created_at))
WITH (fastupdate = on, gin_pending_list_limit = 256)
"""

FTS_TABLE = "collab_message_fts"
HEX = "0123456789abcdef"
ID_GLOB = "[0-9a-f]" * 12


def _rowid(column: str) -> str:
    """The message id in ``column`` (12 hex digits) as the number it writes, in SQLite's SQL."""
    return " + ".join(f"(instr('{HEX}', substr({column}, {i + 1}, 1)) - 1) * {16 ** (11 - i)}" for i in range(12))


def _body(row: str) -> str:
    """What is searched of the message ``row`` (``new``, ``old`` or the table): its text and its tool
    calls' strings (``json_tree`` gives them unescaped)."""
    calls = (f"CASE WHEN json_valid({row}.tool_calls) THEN (SELECT group_concat(value, ' ') "
             f"FROM json_tree({row}.tool_calls) WHERE type = 'text') END")
    return (f"substr(coalesce({row}.text, ''), 1, {MAX_CHARS}) || ' ' || "
            f"substr(coalesce({calls}, ''), 1, {MAX_CHARS})")


def _add(row: str) -> str:
    return f"INSERT INTO {FTS_TABLE}(rowid, body) VALUES ({_rowid(row + '.id')}, {_body(row)});"


def _remove(row: str) -> str:
    # a contentless table forgets a row given exactly the words it was given
    return f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, body) VALUES ('delete', {_rowid(row + '.id')}, {_body(row)});"


SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS collab_message_search_insert AFTER INSERT ON collab_message
    FOR EACH ROW WHEN new.id GLOB '{ID_GLOB}' BEGIN {_add('new')} END""",
    f"""CREATE TRIGGER IF NOT EXISTS collab_message_search_delete AFTER DELETE ON collab_message
    FOR EACH ROW WHEN old.id GLOB '{ID_GLOB}' BEGIN {_remove('old')} END""",
    f"""CREATE TRIGGER IF NOT EXISTS collab_message_search_update AFTER UPDATE OF text, tool_calls ON collab_message
    FOR EACH ROW WHEN new.id GLOB '{ID_GLOB}' AND (old.text IS NOT new.text OR old.tool_calls IS NOT new.tool_calls)
    BEGIN {_remove('old')} {_add('new')} END""",
]
SQLITE_TRIGGER_NAMES = ("collab_message_search_insert", "collab_message_search_delete", "collab_message_search_update")


def restore_search_triggers(apps, schema_editor):
    """SQLite only: the triggers that keep ``collab_message_fts`` up, after ``collab_message`` was
    rebuilt (which drops them; PostgreSQL's index stays)."""
    if schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_TRIGGERS:
            schema_editor.execute(statement, None)


def _require_fts5(connection) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE VIRTUAL TABLE temp.collab_fts5_probe USING fts5(x)")
            cursor.execute("DROP TABLE temp.collab_fts5_probe")
    except Exception as exc:
        raise RuntimeError(
            "this SQLite build has no FTS5, which search needs (docs/web-app.md#search): use a Python whose "
            "sqlite3 module has it (the python.org and Debian builds do)"
        ) from exc


def forwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FUNCTION, None)
        # a build that failed half-way leaves an invalid index of that name: built again
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS message_search", None)
        schema_editor.execute(POSTGRES_INDEX, None)
    elif connection.vendor == "sqlite":
        _require_fts5(connection)
        with transaction.atomic(using=connection.alias):
            schema_editor.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5(body, content='', "
                                  "tokenize='unicode61 remove_diacritics 0')", None)
            schema_editor.execute(f"DELETE FROM {FTS_TABLE}", None)
            schema_editor.execute(f"INSERT INTO {FTS_TABLE}(rowid, body) SELECT {_rowid('collab_message.id')}, "
                                  f"{_body('collab_message')} FROM collab_message WHERE id GLOB '{ID_GLOB}'", None)
            restore_search_triggers(apps, schema_editor)


def backwards(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS message_search", None)
        schema_editor.execute("DROP FUNCTION IF EXISTS collab_message_search_document(text, jsonb, timestamptz)", None)
    elif connection.vendor == "sqlite":
        with transaction.atomic(using=connection.alias):
            for name in SQLITE_TRIGGER_NAMES:
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}", None)
            schema_editor.execute(f"DROP TABLE IF EXISTS {FTS_TABLE}", None)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction (SQLite's part takes one)

    dependencies = [
        ("collab", "0027_people_in_the_loop"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]

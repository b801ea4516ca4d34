"""A job leaves ``stopping`` only as ``cancelled`` (docs/contract.md): the database guard
of 0004 agrees with ``finish_job`` again.

Legal now: queued → running | cancelled | failed; running → stopping | succeeded | failed |
cancelled | interrupted; stopping → cancelled. Terminal states are final.
"""

from django.db import migrations

LEGAL = """
    (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled', 'failed'))
    OR (OLD.status = 'running' AND NEW.status IN ('stopping', 'succeeded', 'failed', 'cancelled', 'interrupted'))
    OR (OLD.status = 'stopping' AND NEW.status = 'cancelled')
"""

LEGAL_0004 = """
    (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled', 'failed'))
    OR (OLD.status = 'running' AND NEW.status IN ('stopping', 'succeeded', 'failed', 'cancelled', 'interrupted'))
    OR (OLD.status = 'stopping' AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'interrupted'))
"""


def postgres(legal: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION collab_job_transition_guard() RETURNS trigger AS $$
BEGIN
    IF NEW.status = OLD.status OR {legal} THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'illegal job transition %% -> %% (job %%)', OLD.status, NEW.status, OLD.id
        USING ERRCODE = 'check_violation';
END
$$ LANGUAGE plpgsql;
"""


def sqlite(legal: str) -> list[str]:
    return [
        "DROP TRIGGER IF EXISTS collab_job_transition_guard;",
        f"""
CREATE TRIGGER collab_job_transition_guard BEFORE UPDATE OF status ON collab_job
FOR EACH ROW WHEN NEW.status <> OLD.status AND NOT ({legal})
BEGIN
    SELECT RAISE(ABORT, 'illegal job transition');
END;
""",
    ]


def _apply(schema_editor, legal: str) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(postgres(legal))  # the trigger of 0004 calls this function
    elif vendor == "sqlite":
        for statement in sqlite(legal):
            schema_editor.execute(statement)


def forwards(apps, schema_editor):
    _apply(schema_editor, LEGAL)


def backwards(apps, schema_editor):
    _apply(schema_editor, LEGAL_0004)


class Migration(migrations.Migration):
    dependencies = [("collab", "0012_db_clock")]
    operations = [migrations.RunPython(forwards, backwards)]

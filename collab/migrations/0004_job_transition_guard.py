"""The database refuses illegal job state transitions (docs/contract.md; constraints as the backstop).

Legal: queued → running | cancelled | failed; running → stopping | succeeded | failed |
cancelled | interrupted; stopping → succeeded | failed | cancelled | interrupted.
Terminal states are final.
"""

from django.db import migrations

LEGAL = """
    (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled', 'failed'))
    OR (OLD.status = 'running' AND NEW.status IN ('stopping', 'succeeded', 'failed', 'cancelled', 'interrupted'))
    OR (OLD.status = 'stopping' AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'interrupted'))
"""

POSTGRES = f"""
CREATE OR REPLACE FUNCTION collab_job_transition_guard() RETURNS trigger AS $$
BEGIN
    IF NEW.status = OLD.status OR {LEGAL} THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'illegal job transition %% -> %% (job %%)', OLD.status, NEW.status, OLD.id
        USING ERRCODE = 'check_violation';
END
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS collab_job_transition_guard ON collab_job;
CREATE TRIGGER collab_job_transition_guard BEFORE UPDATE OF status ON collab_job
    FOR EACH ROW EXECUTE FUNCTION collab_job_transition_guard();
"""

POSTGRES_DROP = """
DROP TRIGGER IF EXISTS collab_job_transition_guard ON collab_job;
DROP FUNCTION IF EXISTS collab_job_transition_guard();
"""

SQLITE = f"""
CREATE TRIGGER IF NOT EXISTS collab_job_transition_guard BEFORE UPDATE OF status ON collab_job
FOR EACH ROW WHEN NEW.status <> OLD.status AND NOT ({LEGAL})
BEGIN
    SELECT RAISE(ABORT, 'illegal job transition');
END;
"""


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE)


def backwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(POSTGRES_DROP)
    elif vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS collab_job_transition_guard;")


class Migration(migrations.Migration):
    dependencies = [("collab", "0003_reconcile_schedule")]
    operations = [migrations.RunPython(forwards, backwards)]

"""Storage per turn (docs/performance.md#targets: "storage grows linearly, ≈ the text plus a small
constant per message"): indexes that every turn paid for and no query needs.

- No query filters events on ``type`` alone: ``event_type_created`` goes.
- ``message_session_created`` is ``message_session_keyset`` read backwards.
- Foreign keys that lead a composite index keep no index of their own (the composite serves
  their joins and cascades); the event's actor is indexed only where it is set.
- ``Branch.tip`` moves on every message and nothing looks a branch up by it: unindexed, the
  branch row's updates are heap-only (HOT) instead of a new entry in every index.
- PostgreSQL only: the ``varchar_pattern_ops`` copy (``…_like``) Django adds beside every index
  on a ``CharField`` — here the 12-character ids and the foreign keys to them. They serve only
  ``LIKE 'prefix%'`` under a non-C collation, and no query matches ids by prefix; equality
  lookups use the plain index. The ``collab_branch`` and ``collab_session`` rows, updated on
  every turn, get a fillfactor that leaves room on their page for those HOT row versions.

SQLite alters a field by rebuilding its table, which drops the table's triggers: the job
transition guard (0004, as 0013 left it) is put back after, both ways.
"""
import importlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


# the tables every turn writes or updates
PER_TURN_MODELS = ("event", "message", "job", "branch", "session")
HOT_TABLES = ("collab_branch", "collab_session")  # a row updated several times per turn
FILLFACTOR = 70


def _like_indexes(apps, schema_editor):
    """(model, field, index name) of each ``…_like`` index Django creates on PostgreSQL for the
    per-turn tables' indexed CharFields (ids and foreign keys to ids), by Django's own naming."""
    for name in PER_TURN_MODELS:
        model = apps.get_model("collab", name)
        for field in model._meta.local_fields:
            if schema_editor._create_like_index_sql(model, field) is not None:
                yield model, field, schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="_like")


def restore_job_transition_guard(apps, schema_editor):
    """SQLite only: the trigger of 0013, lost when collab_job was rebuilt (PostgreSQL keeps it)."""
    if schema_editor.connection.vendor == "sqlite":
        guard = importlib.import_module("collab.migrations.0013_stopping_ends_cancelled")
        for statement in guard.sqlite(guard.LEGAL):
            schema_editor.execute(statement)


def drop_like_indexes(apps, schema_editor):
    restore_job_transition_guard(apps, schema_editor)
    if schema_editor.connection.vendor != "postgresql":
        return
    for model, _, index in _like_indexes(apps, schema_editor):
        schema_editor.execute(schema_editor._delete_index_sql(model, index))  # DROP INDEX IF EXISTS
    for table in HOT_TABLES:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} SET (fillfactor = {FILLFACTOR})")


def create_like_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in HOT_TABLES:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} RESET (fillfactor)")
    for model, field, _ in _like_indexes(apps, schema_editor):
        schema_editor.execute(schema_editor._create_like_index_sql(model, field))


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_token_scopes_fair_share'),
        ('collab', '0017_webhooks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # undone last: after the fields below are altered back (rebuilding collab_job on SQLite)
        migrations.RunPython(migrations.RunPython.noop, restore_job_transition_guard, elidable=False),
        migrations.RemoveIndex(
            model_name='event',
            name='event_type_created',
        ),
        migrations.RemoveIndex(
            model_name='message',
            name='message_session_created',
        ),
        migrations.AlterField(
            model_name='branch',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='branches', to='collab.session'),
        ),
        migrations.AlterField(
            model_name='branch',
            name='tip',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.message'),
        ),
        migrations.AlterField(
            model_name='event',
            name='actor',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='event',
            name='project',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='accounts.project'),
        ),
        migrations.AlterField(
            model_name='event',
            name='session',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='collab.session'),
        ),
        # On PostgreSQL, dropping the index of ``job.branch`` drops every single-column btree index on
        # branch_id that is not a Meta index — the partial unique job_one_active_per_branch too —
        # so that rule is taken off first and put back after.
        migrations.RemoveConstraint(
            model_name='job',
            name='job_one_active_per_branch',
        ),
        migrations.AlterField(
            model_name='job',
            name='branch',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='collab.branch'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('status__in', ('running', 'stopping'))), fields=('branch',), name='job_one_active_per_branch'),
        ),
        migrations.AlterField(
            model_name='job',
            name='caller_branch',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.branch'),
        ),
        migrations.AlterField(
            model_name='job',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='collab.session'),
        ),
        migrations.AlterField(
            model_name='message',
            name='branch',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='collab.branch'),
        ),
        migrations.AlterField(
            model_name='message',
            name='session',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='messages', to='collab.session'),
        ),
        migrations.AlterField(
            model_name='session',
            name='project',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='sessions', to='accounts.project'),
        ),
        migrations.AddIndex(
            model_name='event',
            index=models.Index(condition=models.Q(('actor__isnull', False)), fields=['actor'], name='event_actor'),
        ),
        migrations.RunPython(drop_like_indexes, create_like_indexes, elidable=False),
    ]

"""Storage per turn (docs/performance.md#targets: "storage grows linearly, ≈ the text plus a small
constant per message"): the job's indexes on columns that are NULL for most turns (a person's turn
has no caller, parent job, follow-up source or result artifact; an ended job no lease) index only
the rows where they are set.

- ``caller_session``, ``caller_msg``, ``caller_job``, ``parent_job``, ``result_artifact``: a
  partial ``IS NOT NULL`` index instead of the foreign key's plain one. Every lookup by them is an
  equality or ``IN`` — the services' reads, Django's cascades, PostgreSQL's foreign-key checks —
  which implies the condition, so each still uses its index; the NULLs no longer take an entry
  per turn.
- ``followup_of``: no index of its own; the partial unique ``job_one_followup_per_job`` is that
  index already. On PostgreSQL, dropping the field's index drops every single-column btree index
  on the column that is not a Meta index — that constraint too — so it is taken off first and put
  back after (as 0018 does for ``job_one_active_per_branch``).
- ``job_caller_followup`` covers the rows with a caller branch, ``job_status_lease`` the open jobs
  (queued, running, stopping: what is read by status alone — the reconciler's expired leases and
  stale queued jobs).

Backwards, PostgreSQL's plain indexes come back without the ``varchar_pattern_ops`` copies Django
would add beside them (0018 dropped those; its own reversal puts them back). SQLite alters a field
by rebuilding its table, which drops the table's triggers: the job transition guard (0004, as 0013
left it) is put back after, both ways (as 0018 and 0019 do).
"""
import importlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

_0018 = importlib.import_module("collab.migrations.0018_storage_per_turn")

PARTIAL = ("caller_session", "caller_msg", "caller_job", "parent_job", "result_artifact", "followup_of")


def restore_guard_and_drop_like_indexes(apps, schema_editor):
    """Backwards, last: the SQLite trigger back; on PostgreSQL, the ``…_like`` copies that altering
    the fields back to indexed created, so the schema is 0019's again."""
    _0018.restore_job_transition_guard(apps, schema_editor)
    if schema_editor.connection.vendor != "postgresql":
        return
    Job = apps.get_model("collab", "Job")
    for name in PARTIAL:
        column = Job._meta.get_field(name).column
        index = schema_editor._create_index_name(Job._meta.db_table, [column], suffix="_like")
        schema_editor.execute(schema_editor._delete_index_sql(Job, index))  # DROP INDEX IF EXISTS


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_token_scopes_fair_share'),
        ('collab', '0019_job_text_once'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        # undone last: after the fields below are altered back (rebuilding collab_job on SQLite)
        migrations.RunPython(migrations.RunPython.noop, restore_guard_and_drop_like_indexes, elidable=False),
        migrations.RemoveIndex(
            model_name='job',
            name='job_status_lease',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_caller_followup',
        ),
        migrations.AlterField(
            model_name='job',
            name='caller_job',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.job'),
        ),
        migrations.AlterField(
            model_name='job',
            name='caller_msg',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.message'),
        ),
        migrations.AlterField(
            model_name='job',
            name='caller_session',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='collab.session'),
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='job_one_followup_per_job',
        ),
        migrations.AlterField(
            model_name='job',
            name='followup_of',
            field=models.ForeignKey(blank=True, db_index=False, help_text='for a follow-up turn: the finished job whose result it carries', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.job'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('followup_of__isnull', False)), fields=('followup_of',), name='job_one_followup_per_job'),
        ),
        migrations.AlterField(
            model_name='job',
            name='parent_job',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='collab.job'),
        ),
        migrations.AlterField(
            model_name='job',
            name='result_artifact',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='collab.artifact'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('caller_branch__isnull', False)), fields=['caller_branch', 'followup_state'], name='job_caller_followup'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ('queued', 'running', 'stopping'))), fields=['status', 'lease_expires_at'], name='job_status_lease'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('caller_session__isnull', False)), fields=['caller_session'], name='job_caller_session'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('caller_msg__isnull', False)), fields=['caller_msg'], name='job_caller_msg'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('caller_job__isnull', False)), fields=['caller_job'], name='job_caller_job'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('parent_job__isnull', False)), fields=['parent_job'], name='job_parent_job'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('result_artifact__isnull', False)), fields=['result_artifact'], name='job_result_artifact'),
        ),
        migrations.RunPython(_0018.restore_job_transition_guard, migrations.RunPython.noop, elidable=False),
    ]

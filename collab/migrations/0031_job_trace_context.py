"""The W3C trace context an execution's spans join (docs/operations.md#traces).

SQLite adds a column with a default by rebuilding its table, which drops the table's triggers:
the job transition guard (as 0027 left it, with ``waiting``) is put back after, both ways.
"""
import importlib

from django.db import migrations, models

_guard = importlib.import_module("collab.migrations.0013_stopping_ends_cancelled")
_0027 = importlib.import_module("collab.migrations.0027_people_in_the_loop")


def restore_job_transition_guard(apps, schema_editor):
    """SQLite only: the guard's trigger, lost when collab_job was rebuilt (PostgreSQL keeps it)."""
    if schema_editor.connection.vendor == "sqlite":
        _guard._apply(schema_editor, _0027.LEGAL)


class Migration(migrations.Migration):

    dependencies = [
        ('collab', '0030_thread_metadata'),
    ]

    operations = [
        # undone last: after the field below is removed (rebuilding collab_job on SQLite)
        migrations.RunPython(migrations.RunPython.noop, restore_job_transition_guard, elidable=False),
        migrations.AddField(
            model_name='job',
            name='trace_context',
            field=models.CharField(blank=True, default='', max_length=512),
        ),
        migrations.RunPython(restore_job_transition_guard, migrations.RunPython.noop, elidable=False),
    ]

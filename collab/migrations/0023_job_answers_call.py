"""A foreground ``agent`` call from outside a turn (tool gateway, MCP) runs its child on a worker
and answers with its result (docs/capacity.md, "No agent turn runs in a web process"):
``Job.answers_call`` marks such a child, so no follow-up carries its result a second time.

SQLite adds a column with a default by rebuilding its table, which drops the table's triggers:
the job transition guard (0004, as 0013 left it) is put back after, both ways (as 0018 does).
"""
import importlib

from django.db import migrations, models

_0018 = importlib.import_module("collab.migrations.0018_storage_per_turn")


class Migration(migrations.Migration):

    dependencies = [
        ('collab', '0022_job_open_on_branch'),
    ]

    operations = [
        # undone last: after the field below is removed (rebuilding collab_job on SQLite)
        migrations.RunPython(migrations.RunPython.noop, _0018.restore_job_transition_guard, elidable=False),
        migrations.AddField(
            model_name='job',
            name='answers_call',
            field=models.BooleanField(default=False, help_text='a foreground agent call from outside a turn (tool gateway, MCP) waits for this job and answers with its result: it runs on a worker like a background job, and no follow-up carries its result'),
        ),
        migrations.AlterField(
            model_name='job',
            name='run_in_background',
            field=models.BooleanField(default=True, help_text="handed to the worker queue (an inline foreground child runs in its caller's turn instead)"),
        ),
        migrations.RunPython(_0018.restore_job_transition_guard, migrations.RunPython.noop, elidable=False),
    ]

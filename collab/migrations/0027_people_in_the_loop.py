"""People in the loop (docs/contract.md#people-in-the-loop): a turn may wait for a person.

``PersonAsk`` (an approval of a tool call or an ``ask_person`` question), ``AgentSpec.approvals``,
and the job status ``waiting``, with the transitions the database's guard allows for it:
running → waiting (the turn pauses), waiting → queued (decided: it resumes) | cancelled | failed.
"""

import collab.models.ids
import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
import importlib

from django.db import migrations, models

# the guard's SQL for each database, as 0013 writes it
_guard = importlib.import_module("collab.migrations.0013_stopping_ends_cancelled")

LEGAL = """
    (OLD.status = 'queued' AND NEW.status IN ('running', 'cancelled', 'failed'))
    OR (OLD.status = 'running' AND NEW.status IN ('stopping', 'succeeded', 'failed', 'cancelled', 'interrupted', 'waiting'))
    OR (OLD.status = 'stopping' AND NEW.status = 'cancelled')
    OR (OLD.status = 'waiting' AND NEW.status IN ('queued', 'cancelled', 'failed'))
"""


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_token_scopes_fair_share'),
        ('collab', '0026_webhook_deliveries_plural'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='PersonAsk',
            fields=[
                ('id', models.CharField(default=collab.models.ids.new_id, editable=False, max_length=12, primary_key=True, serialize=False)),
                ('call_index', models.PositiveIntegerField()),
                ('tool_call_id', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('approval', 'Approval'), ('question', 'Question')], max_length=16)),
                ('tool', models.CharField(max_length=64)),
                ('arguments', models.JSONField(blank=True, default=dict)),
                ('question', models.TextField(blank=True, default='')),
                ('choices', models.JSONField(blank=True, default=list)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('answered', 'Answered'), ('expired', 'Expired'), ('closed', 'Closed')], default='pending', max_length=16)),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('decision', models.JSONField(blank=True, default=dict)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('provider_state', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'ordering': ['created_at', 'id'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='job_status_valid',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_status_lease',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_open_on_branch',
        ),
        migrations.AddField(
            model_name='agentspec',
            name='approvals',
            field=models.JSONField(blank=True, default=list, help_text='tools whose every call waits for a person\'s approval; ["*"]: all'),
        ),
        migrations.AlterField(
            model_name='job',
            name='status',
            field=models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('stopping', 'Stopping'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('interrupted', 'Interrupted'), ('waiting', 'Waiting')], default='queued', max_length=16),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ('queued', 'running', 'stopping', 'waiting'))), fields=['branch'], name='job_open_on_branch'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status__in', ('queued', 'running', 'stopping', 'waiting'))), fields=['status', 'lease_expires_at'], name='job_status_lease'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'running', 'stopping', 'succeeded', 'failed', 'cancelled', 'interrupted', 'waiting'])), name='job_status_valid'),
        ),
        migrations.AddField(
            model_name='personask',
            name='branch',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='asks', to='collab.branch'),
        ),
        migrations.AddField(
            model_name='personask',
            name='call_message',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='collab.message'),
        ),
        migrations.AddField(
            model_name='personask',
            name='decided_by',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='personask',
            name='job',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='asks', to='collab.job'),
        ),
        migrations.AddField(
            model_name='personask',
            name='project',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='asks', to='accounts.project'),
        ),
        migrations.AddField(
            model_name='personask',
            name='session',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='asks', to='collab.session'),
        ),
        migrations.AddField(
            model_name='personask',
            name='to_user',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='asks_to_me', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddIndex(
            model_name='personask',
            index=models.Index(condition=models.Q(('status', 'pending')), fields=['project', 'created_at'], name='ask_pending'),
        ),
        migrations.AddIndex(
            model_name='personask',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('status', 'pending')), fields=['expires_at'], name='ask_pending_expiry'),
        ),
        migrations.AddConstraint(
            model_name='personask',
            constraint=models.UniqueConstraint(fields=('job', 'tool_call_id'), name='ask_one_per_tool_call'),
        ),
        migrations.AddConstraint(
            model_name='personask',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['approval', 'question'])), name='ask_kind_valid'),
        ),
        migrations.AddConstraint(
            model_name='personask',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['pending', 'approved', 'rejected', 'answered', 'expired', 'closed'])), name='ask_status_valid'),
        ),
        migrations.AddConstraint(
            model_name='personask',
            constraint=models.CheckConstraint(condition=models.Q(('status', 'pending'), ('decided_at__isnull', False), _connector='OR'), name='ask_decided_has_time'),
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='job_queued_not_started',
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('started_at__isnull', True), ('status', 'queued')), models.Q(('status', 'queued'), _negated=True), ('model_calls__gt', 0), _connector='OR'), name='job_queued_not_started'),
        ),
        migrations.RemoveConstraint(
            model_name='webhookdelivery',
            name='delivery_one_per_webhook_job_event',
        ),
        migrations.RemoveConstraint(
            model_name='webhookdelivery',
            name='delivery_event_valid',
        ),
        migrations.AddField(
            model_name='webhookdelivery',
            name='ask',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='collab.personask'),
        ),
        migrations.AlterField(
            model_name='webhookdelivery',
            name='event',
            field=models.CharField(choices=[('execution.finished', 'Execution Finished'), ('ask.requested', 'Ask Requested'), ('ask.decided', 'Ask Decided')], default='execution.finished', max_length=32),
        ),
        migrations.AddConstraint(
            model_name='webhookdelivery',
            constraint=models.UniqueConstraint(condition=models.Q(('ask__isnull', True)), fields=('webhook', 'job', 'event'), name='delivery_one_per_webhook_job_event'),
        ),
        migrations.AddConstraint(
            model_name='webhookdelivery',
            constraint=models.UniqueConstraint(condition=models.Q(('ask__isnull', False)), fields=('webhook', 'ask', 'event'), name='delivery_one_per_webhook_ask_event'),
        ),
        migrations.AddConstraint(
            model_name='webhookdelivery',
            constraint=models.CheckConstraint(condition=models.Q(('event__in', ['execution.finished', 'ask.requested', 'ask.decided'])), name='delivery_event_valid'),
        ),
        migrations.RunPython(lambda apps, editor: _guard._apply(editor, LEGAL),
                             lambda apps, editor: _guard._apply(editor, _guard.LEGAL)),
    ]

from django.db import migrations, models


class Migration(migrations.Migration):
    """Which rule made an approval wait: the agent spec's ``approvals`` or the project's
    (docs/contract.md#people-in-the-loop)."""

    dependencies = [
        ('collab', '0028_search'),
    ]

    operations = [
        migrations.AddField(
            model_name='personask',
            name='rule',
            field=models.CharField(blank=True, choices=[('spec', 'Spec'), ('project', 'Project')], default='', max_length=16),
        ),
        # the approvals written before this migration: a spec's, the only rule there was
        migrations.RunSQL("UPDATE collab_personask SET rule = 'spec' WHERE kind = 'approval'", migrations.RunSQL.noop),
        migrations.AddConstraint(
            model_name='personask',
            constraint=models.CheckConstraint(condition=models.Q(('rule', ''), models.Q(('kind', 'approval'), ('rule__in', ['spec', 'project'])), _connector='OR'), name='ask_rule_of_an_approval'),
        ),
    ]

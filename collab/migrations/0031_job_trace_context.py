from django.db import migrations, models


class Migration(migrations.Migration):
    """The W3C trace context an execution's spans join (docs/operations.md#traces)."""

    dependencies = [
        ('collab', '0030_thread_metadata'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='trace_context',
            field=models.CharField(blank=True, default='', max_length=512),
        ),
    ]

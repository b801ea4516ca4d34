from django.db import migrations, models


class Migration(migrations.Migration):
    """A session's metadata: a client's own key-value data (a LangGraph thread's: docs/langgraph.md)."""

    dependencies = [
        ('collab', '0029_ask_rule'),
    ]

    operations = [
        migrations.AddField(
            model_name='session',
            name='metadata',
            field=models.JSONField(blank=True, default=dict, help_text="a client's own key-value data (a LangGraph thread's metadata: docs/langgraph.md)"),
        ),
    ]

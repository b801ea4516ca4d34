"""Session.selected_branch goes: nothing read it. The branch a person's turn
goes to by default is the selected HEAD's (``Session.head``), and which branch a
viewer reads is kept per viewer (docs/web-app.md); only sub-agent sessions wrote the field.
Branch.merged_into stays (docs/models.md lists it); its help text now says it is never set."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("collab", "0015_branch_lane"),
    ]

    operations = [
        migrations.RemoveField(model_name="session", name="selected_branch"),
        migrations.AlterField(
            model_name="branch",
            name="merged_into",
            field=models.ForeignKey(
                blank=True,
                help_text="kept for SPEC §2's branch record (merged and archived are stored apart, OP §2.6); "
                          "Trellis has no merge operation, so nothing sets it yet and it is always empty",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="collab.branch",
            ),
        ),
    ]

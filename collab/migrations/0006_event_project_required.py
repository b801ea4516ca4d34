import django.db.models.deletion
from django.db import migrations, models


def fill_project(apps, schema_editor):
    Event = apps.get_model("collab", "Event")
    Session = apps.get_model("collab", "Session")
    for session_id, project_id in Session.objects.values_list("id", "project_id"):
        Event.objects.filter(session_id=session_id, project__isnull=True).update(project_id=project_id)


class Migration(migrations.Migration):
    dependencies = [("collab", "0005_event_project"), ("accounts", "0002_project_last_event_seq")]

    operations = [
        migrations.RunPython(fill_project, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="event",
            name="project",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="events", to="accounts.project"),
        ),
    ]

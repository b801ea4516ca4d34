from django.db import migrations


def create_schedule(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="collab-reconcile",
        defaults={"func": "collab.tasks.reconcile", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def drop_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="collab-reconcile").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("collab", "0002_collab_links"),
        ("django_q", "__latest__"),
    ]

    operations = [migrations.RunPython(create_schedule, drop_schedule)]

"""Branch.lane: each branch's column in the session DAG (docs/web-app.md), and the index its
keyset pages read (session, created_at, id).

Existing branches get lanes as if each had been placed when it opened: in creation order, the
free lane nearest its parent's, where a lane is free again once its branch was archived before
the new one opened. (The same rule as ``collab.dag_layout.pick_lane``, copied so this migration
never changes with the app code.)
"""

from django.db import migrations, models


def _pick(taken, parent):
    parent = 0 if parent is None else parent
    distance = 0
    while True:
        for lane in (parent + distance, parent - distance):
            if lane >= 0 and lane not in taken:
                return lane
        distance += 1


def assign_lanes(apps, schema_editor):
    Branch = apps.get_model("collab", "Branch")
    Message = apps.get_model("collab", "Message")
    Job = apps.get_model("collab", "Job")
    session_ids = Branch.objects.values_list("session_id", flat=True).distinct()
    for sid in session_ids.iterator():
        placed = []  # (branch id, lane, archived_at)
        lanes = {}
        for b in Branch.objects.filter(session_id=sid).order_by("created_at", "id"):
            parent = None
            if b.forked_from_id:
                holder = Message.objects.filter(pk=b.forked_from_id, session_id=sid).values_list("branch_id", flat=True).first()
                parent = lanes.get(holder)
            if parent is None and b.created_by_job_id:
                holder = Job.objects.filter(pk=b.created_by_job_id, session_id=sid).values_list("branch_id", flat=True).first()
                parent = lanes.get(holder)
            if parent is None and b.parent_branch_id:
                parent = lanes.get(b.parent_branch_id)
            taken = {lane for _, lane, archived_at in placed if archived_at is None or archived_at > b.created_at}
            lane = _pick(taken, parent)
            lanes[b.pk] = lane
            placed.append((b.pk, lane, b.archived_at if b.archived else None))
            if lane:
                Branch.objects.filter(pk=b.pk).update(lane=lane)


class Migration(migrations.Migration):

    dependencies = [
        ("collab", "0014_session_visibility"),
    ]

    operations = [
        migrations.AddField(
            model_name="branch",
            name="lane",
            field=models.PositiveSmallIntegerField(
                default=0,
                help_text="its column in the session's DAG, chosen when it opens (collab.dag_layout.pick_lane) and "
                          "kept for life; reused only after the branch is archived and idle",
            ),
        ),
        migrations.RunPython(assign_lanes, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(fields=["session", "-created_at", "-id"], name="message_session_keyset"),
        ),
    ]

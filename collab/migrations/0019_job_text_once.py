"""Storage per turn (docs/performance.md#targets: "storage grows linearly, ≈ the text plus a small
constant per message"): a turn's prompt and its answer are stored once, in their nodes.

- ``Job.prompt`` holds the prompt only until the turn's prompt node does: NULL from then on (an
  idle branch's admission writes the node with the job row; the claim that writes it for a job
  that queued clears the row's copy in its UPDATE). ``Job.prompt_text`` reads either.
- ``Job.result_text`` is NULL when the result is the whole text of the job's final answer (its
  ``final`` assistant node). ``Job.result`` reads either.

Existing rows: a copy that its node holds exactly is cleared, so old jobs shrink too and answer as
before; a copy that differs (none should) is kept, and is read as it is. Backwards, every copy is
written back before the columns are NOT NULL again.

SQLite alters a field by rebuilding its table, which drops the table's triggers: the job
transition guard (0004, as 0013 left it) is put back after, both ways (as 0018 does).
"""
import importlib

from django.db import migrations, models
from django.db.models import Case, Exists, F, OuterRef, Subquery, Value, When
from django.db.models.functions import Coalesce, Concat, Length, Substr

_0018 = importlib.import_module("collab.migrations.0018_storage_per_turn")


def _final_answers(Message):
    return Message.objects.filter(role="assistant", metadata__final=True).order_by()


def store_once(apps, schema_editor):
    Job, Message = apps.get_model("collab", "Job"), apps.get_model("collab", "Message")
    # the prompt node's text is the prompt after its header (collab.services.admission.write_prompt_node)
    as_written = Case(When(prompt_header="", then=F("prompt")),
                      default=Concat(F("prompt_header"), Value("\n\n"), F("prompt"), output_field=models.TextField()),
                      output_field=models.TextField())
    Job.objects.filter(prompt__isnull=False, prompt_msg__isnull=False, prompt_msg__text=as_written).update(prompt=None)
    Job.objects.filter(result_text__isnull=False, result_artifact__isnull=True).filter(
        Exists(_final_answers(Message).filter(job_id=OuterRef("pk"), text=OuterRef("result_text")))
    ).update(result_text=None)


def store_twice(apps, schema_editor):
    Job, Message = apps.get_model("collab", "Job"), apps.get_model("collab", "Message")
    node = Message.objects.filter(pk=OuterRef("prompt_msg_id")).annotate(prompt=Case(
        When(text__startswith=Concat(OuterRef("prompt_header"), Value("\n\n"), output_field=models.TextField()),
             then=Substr("text", Length(OuterRef("prompt_header")) + 3)),
        default=F("text"), output_field=models.TextField()))
    Job.objects.filter(prompt__isnull=True, prompt_header="").update(
        prompt=Coalesce(Subquery(node.values("text")[:1]), Value("")))
    Job.objects.filter(prompt__isnull=True).exclude(prompt_header="").update(
        prompt=Coalesce(Subquery(node.values("prompt")[:1]), Value("")))
    Job.objects.filter(result_text__isnull=True).update(result_text=Coalesce(
        Subquery(_final_answers(Message).filter(job_id=OuterRef("pk")).values("text")[:1]), Value("")))


class Migration(migrations.Migration):

    dependencies = [
        ('collab', '0018_storage_per_turn'),
    ]

    operations = [
        # undone last: after the fields below are altered back (rebuilding collab_job on SQLite)
        migrations.RunPython(migrations.RunPython.noop, _0018.restore_job_transition_guard, elidable=False),
        migrations.AlterField(
            model_name='job',
            name='prompt',
            field=models.TextField(blank=True, default='', null=True),
        ),
        migrations.AlterField(
            model_name='job',
            name='result_text',
            field=models.TextField(blank=True, default='', null=True),
        ),
        migrations.RunPython(store_once, store_twice, elidable=False),
        migrations.RunPython(_0018.restore_job_transition_guard, migrations.RunPython.noop, elidable=False),
    ]

"""Rows loaded without ``Model.__init__`` (collab/infra/fast_load.py, part of reaching ≥ 100 turns/s): the
instance is the one Django's own ``from_db`` makes, and Django's path is taken wherever the two
could differ (deferred columns, a field with a descriptor of its own, an init signal listened to)."""

import pytest
from django.db import models
from django.db.models.signals import post_init
from django.test.utils import isolate_apps

from accounts.models import Project
from collab.models import Branch, Job, Message, Session
from collab.services.turns import do_start_user_turn
from collab.services.sessions import do_create_session
from collab.infra.fast_load import FastLoad


@pytest.fixture
def member_session(team):
    return team.member, do_create_session(team.member, team.alpha, title="fast load")


def _as_django_loads(instance):
    """The instance ``Model.from_db`` (``cls(*values)``) makes of the same row."""
    model = type(instance)
    names = [f.attname for f in model._meta.concrete_fields]
    return models.Model.from_db.__func__(model, instance._state.db, names, [getattr(instance, n) for n in names])


def _same(a, b):
    assert type(a) is type(b)
    assert {k: v for k, v in a.__dict__.items() if k != "_state"} == {k: v for k, v in b.__dict__.items() if k != "_state"}
    assert (a._state.adding, a._state.db) == (b._state.adding, b._state.db) == (False, "default")


@pytest.mark.django_db
def test_loaded_rows_are_the_instances_djangos_from_db_makes(member_session):
    user, session = member_session
    job = do_start_user_turn(user, session, "hello")
    loaded = Job.objects.select_related("project", "session", "branch", "prompt_msg").get(pk=job.pk)
    assert "__init__" not in type(loaded).__dict__ and loaded._fast_load_names  # the fast path applies
    for instance in (loaded, loaded.project, loaded.session, loaded.branch, loaded.prompt_msg):
        _same(instance, _as_django_loads(instance))
    # and it behaves as one: saved as an update, its relations read, compared by pk
    loaded.prompt_header = "h"
    loaded.save(update_fields=["prompt_header"])
    assert Job.objects.get(pk=job.pk).prompt_header == "h"
    assert loaded.branch.session_id == session.pk and loaded.project == Project.objects.get(pk=session.project_id)
    assert loaded.get_deferred_fields() == set()


@pytest.mark.django_db
def test_deferred_columns_take_djangos_path(member_session):
    _user, session = member_session
    partial = Session.objects.only("pk", "title").get(pk=session.pk)
    assert partial.get_deferred_fields() >= {"head_id", "last_event_seq"}
    assert partial.last_event_seq == Session.objects.get(pk=session.pk).last_event_seq  # loaded on access


@pytest.mark.django_db
def test_an_init_signal_listened_to_is_sent_for_each_loaded_row(member_session):
    _user, session = member_session
    seen = []

    def listener(sender, instance, **kwargs):
        seen.append(instance.pk)

    post_init.connect(listener, sender=Branch)
    try:
        branches = list(Branch.objects.filter(session=session))
    finally:
        post_init.disconnect(listener, sender=Branch)
    assert seen == [b.pk for b in branches] and seen
    list(Message.objects.filter(session=session))  # another model's loads are not its business
    assert len(seen) == len(branches)


@isolate_apps("collab")
def test_a_field_with_a_descriptor_of_its_own_takes_djangos_path():
    class WithFile(FastLoad, models.Model):
        upload = models.FileField()

        class Meta:
            app_label = "collab"

    class Plain(FastLoad, models.Model):
        name = models.CharField(max_length=10)
        parent = models.ForeignKey("self", null=True, on_delete=models.CASCADE)

        class Meta:
            app_label = "collab"

    loaded = WithFile.from_db("default", ["id", "upload"], [1, "a.txt"])
    assert WithFile._fast_load_names == ()
    assert loaded.upload.name == "a.txt"  # the FileDescriptor made it a FieldFile
    plain = Plain.from_db("default", ["id", "name", "parent_id"], [1, "x", None])
    assert Plain._fast_load_names == ("id", "name", "parent_id")
    assert (plain.pk, plain.name, plain.parent, plain._state.adding) == (1, "x", None, False)

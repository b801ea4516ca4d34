"""Every domain model is in the admin, and its pages load for operators."""

import pytest
from django.apps import apps
from django.contrib import admin
from django.test import Client
from django.urls import reverse


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw-secret-123")
    client = Client()
    client.force_login(user)
    return client


def domain_models():
    return [m for app in ("accounts", "collab") for m in apps.get_app_config(app).get_models()
            if not m._meta.auto_created]


def test_every_domain_model_is_registered_in_the_admin():
    missing = [m._meta.label for m in domain_models() if not admin.site.is_registered(m)]
    assert missing == []


@pytest.mark.parametrize("model", domain_models(), ids=lambda m: m._meta.label)
def test_its_changelist_loads_for_an_operator(db, operator, model, team, scripted_session):
    scripted_session(team.member, [{"text": "x"}])  # some rows to list
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    assert operator.get(url).status_code == 200


def test_an_events_page_shows_the_payload_its_readers_get_not_the_stored_reference(db, operator, team, run_queued):
    """The log keeps a reference for ``message.created`` (the text lives in the message
    row); the admin's event page shows the whole payload, as the API and the sockets do."""
    from collab.models import AgentSpec, Event
    from collab.services.sessions import do_create_session
    from collab.services.turns import do_start_user_turn

    AgentSpec.objects.create(project=team.alpha, agent_id="echo", provider="scripted", script=[{"text": "said {{prompt}}"}])
    session = do_create_session(team.member, team.alpha, title="audit", agent_id="echo")
    do_start_user_turn(team.member, session, "a distinctive prompt")
    run_queued()
    answer = Event.objects.filter(session=session, type="message.created").order_by("seq").last()
    assert "text" not in answer.payload  # stored as a reference
    page = operator.get(reverse("admin:collab_event_change", args=[answer.pk]))
    assert page.status_code == 200
    assert "said a distinctive prompt" in page.content.decode()

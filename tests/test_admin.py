"""Every domain model is in the admin (issue: foundation), and its pages load for operators."""

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

"""The admin calls itself Trellis and names every model's list in correct English."""

import re

import pytest
from django.apps import apps
from django.test import Client
from django.urls import reverse


@pytest.fixture
def staff(django_user_model):
    user = django_user_model.objects.create_superuser("operator", "op@example.com", "pw-secret-123")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_index_is_titled_trellis_not_django(db, staff):
    page = staff.get(reverse("admin:index")).content.decode()
    assert "Trellis administration" in page
    assert "Django administration" not in page
    assert "Django site admin" not in page


def test_the_admin_index_lists_webhook_deliveries_in_the_plural(db, staff):
    page = staff.get(reverse("admin:index")).content.decode()
    assert "Webhook deliveries" in page
    assert "deliverys" not in page.lower()


@pytest.mark.parametrize("app", ["accounts", "collab"])
def test_no_model_of_trellis_has_a_naively_made_plural(app):
    """Django's default plural adds an ``s``: "delivery" → "deliverys", "address" → "addresss"."""
    wrong = [
        f"{m._meta.label}: {m._meta.verbose_name_plural}"
        for m in apps.get_app_config(app).get_models()
        if re.search(r"([^aeiou]ys|ss|xs|chs|shs)$", str(m._meta.verbose_name_plural))
    ]
    assert wrong == []

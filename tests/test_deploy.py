"""Health and readiness endpoints for a load balancer, and the deploy/ files.

The processes of deploy/Procfile and deploy/nginx.conf run for real in
tests/test_scaled_deployment.py; deploy/compose.yaml (no container runtime here) is checked to
run the same commands and to put that nginx.conf in front of the web service.
"""

import shlex

import pytest
import yaml
from django.test import override_settings


@pytest.mark.django_db
def test_healthz_answers_without_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True}
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db(transaction=True)
def test_readyz_checks_database_and_channel_layer(client):
    """Readiness runs a query and a round trip through the configured channel layer (Redis on the
    scaled run, in-memory on the embedded default)."""
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["ok"] is True
    assert set(body["checks"]) == {"database", "channel_layer"}
    assert all(check["ok"] for check in body["checks"].values())


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_an_unreachable_channel_layer(client):
    """Nothing listens on port 1: the probe says which dependency failed, without its address."""
    layer = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                         "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]}}}
    with override_settings(CHANNEL_LAYERS=layer):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ok"] is False
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["channel_layer"]["ok"] is False
    assert "127.0.0.1" not in response.content.decode()


def test_compose_runs_the_procfile_processes_behind_the_tested_proxy():
    from tests.conftest import ROOT
    from tests.test_scaled_deployment import procfile

    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "release", "web", "worker", "proxy"} <= set(services)
    expand = {"${HOST:-0.0.0.0}": "0.0.0.0", "${PORT:-8000}": "8000"}
    for name in ("release", "web", "worker"):
        line = procfile()[name]
        for var, value in expand.items():
            line = line.replace(var, value)
        assert services[name]["command"] == shlex.split(line), name
    assert "./nginx.conf:/etc/nginx/nginx.conf:ro" in services["proxy"]["volumes"]
    assert "server web:8000;" in (ROOT / "deploy" / "nginx.conf").read_text()
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])

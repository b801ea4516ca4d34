"""Security headers, login throttling and the demo user."""

import io
import subprocess
import sys

from django.core.management import call_command
from django.test import Client

from tests.conftest import ROOT
from tests.test_settings import CLEAN


def test_pages_and_the_api_carry_the_security_headers(team):
    client = Client()
    client.force_login(team.member)
    for path in ("/", "/p/alpha/", "/account/tokens", "/api/projects", "/accounts/login/"):
        r = client.get(path)
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self';" in csp and "style-src 'self';" in csp, (path, csp)
        assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp and "unsafe-eval" not in csp
        assert "ws://testserver" in csp  # the live socket of this host
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Referrer-Policy"] == "same-origin"


def test_the_pages_have_no_inline_script_style_or_handler(team, scripted_session):
    """What the CSP forbids is not in the pages: no inline <script>, <style>, style= or on…= / hx-on."""
    import re

    api, sid = scripted_session(team.member, [{"text": "x"}])
    client = Client()
    client.force_login(team.member)
    for path in ("/", "/p/alpha/", f"/s/{sid}/", "/account/tokens", "/accounts/login/"):
        html = client.get(path).content.decode()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), path
        assert "<style" not in html and not re.search(r"\s(style|on[a-z]+|hx-on[:\w-]*)=", html), path


def test_hsts_is_sent_when_cookies_are_secure(tmp_path):
    code = "import config.settings as s; print(s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)"

    def flags(**env):
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), **env})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert flags() == ["False", "0"]  # the embedded default: plain http on loopback
    assert flags(DJANGO_ALLOWED_HOSTS="trellis.example.com") == ["True", "31536000"]
    assert flags(DJANGO_SECURE_COOKIES="1", DJANGO_HSTS_SECONDS="600") == ["True", "600"]


def test_a_secure_request_gets_hsts(settings, team):
    settings.SECURE_HSTS_SECONDS = 31_536_000
    r = Client().get("/accounts/login/", secure=True)
    assert r.headers["Strict-Transport-Security"].startswith("max-age=31536000")


def login(client, username, password):
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_login_is_throttled_after_repeated_failures(team, settings):
    """After the allowed failures the right password is refused too (429) until the cool-off;
    other people still log in."""
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login(client, "member", "wrong-password").status_code == 200  # the form again
    assert login(client, "member", "wrong-password").status_code == 429  # the last allowed failure locks
    assert login(client, "member", "pw-secret-123").status_code == 429
    assert login(Client(), "viewer", "pw-secret-123").status_code == 302


def test_the_demo_user_is_an_operator_only_on_the_embedded_default(db, settings, tmp_path, django_user_model):
    settings.VAR_DIR = tmp_path
    settings.DATABASE_URL = "postgres://db.example/trellis"
    call_command("demo", stdout=io.StringIO())
    demo = django_user_model.objects.get(username="demo")
    assert not demo.is_staff and not demo.is_superuser

    demo.is_staff = demo.is_superuser = True  # made an operator earlier (e.g. by an older demo)
    demo.save()
    call_command("demo", stdout=io.StringIO())
    demo.refresh_from_db()
    assert not demo.is_staff and not demo.is_superuser


def test_on_the_embedded_default_the_demo_user_is_the_operator(db, settings, tmp_path, django_user_model):
    settings.VAR_DIR = tmp_path
    settings.DATABASE_URL = ""
    call_command("demo", stdout=io.StringIO())
    demo = django_user_model.objects.get(username="demo")
    assert demo.is_staff and demo.is_superuser

"""A newcomer's first minutes (docs/contract.md#deployments, README "Quick start").

A fresh clone, no configuration at all, the README's one command: ``scripts/run``
must make its own .venv, install, migrate, create the demo project, serve web +
worker, and print a login that works. Only committed files are in the clone, so
this is also the check that nothing the run needs lives only in a work tree.
"""

import http.cookiejar
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from django.conf import settings

from tests.conftest import ROOT, free_port

# The newcomer's run knows nothing of this run's database (newcomer_env drops DATABASE_URL and
# REDIS_URL): it is the same test in both of scripts/test's runs, so it runs in one of them — the
# embedded default's (SQLite), as test_scaled_deployment runs only in the PostgreSQL + Redis one.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(settings.REDIS_URL), reason="runs in the embedded default's (SQLite) run only"),
]

FIRST_RUN_TIMEOUT = 300  # creating .venv and pip-installing dominates
HTTP_TIMEOUT = 60
# What a newcomer's shell does not have: our deployment and test settings.
CONFIG_VARS = ("DATABASE_URL", "REDIS_URL", "PORT", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
CONFIG_PREFIXES = ("DJANGO_", "TRELLIS_")


def newcomer_env() -> dict:
    env = {
        k: v for k, v in os.environ.items()
        if k not in CONFIG_VARS and not k.startswith(CONFIG_PREFIXES) and not k.startswith("PYTEST_")
    }
    assert "PATH" in env and "HOME" in env
    return env


def _tail(path, n=4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def wait_for_login_line(proc, out, err, port, timeout):
    pattern = re.compile(rf"^Log in at (http://127\.0\.0\.1:{port}/) with login: (\S+) / (\S+)\s*$", re.M)
    deadline = time.monotonic() + timeout
    while True:
        match = pattern.search(out.read_text(errors="replace"))
        if match:
            return match.groups()
        if proc.poll() is not None:
            pytest.fail(f"scripts/run exited with {proc.returncode} before printing the login.\n"
                        f"stdout:\n{_tail(out)}\nstderr:\n{_tail(err)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no login line after {timeout}s.\nstdout:\n{_tail(out)}\nstderr:\n{_tail(err)}")
        time.sleep(0.5)


def open_url(opener, url, data=None, timeout=10):
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    with opener.open(url, data=body, timeout=timeout) as r:
        return r.status, r.geturl(), r.read().decode("utf-8", "replace")


def get_when_up(opener, url, proc, timeout, out, err):
    """The login line is printed as daphne starts: wait until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return open_url(opener, url, timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
                raise AssertionError(f"{url} did not answer ({exc}); scripts/run {state}.\n"
                                     f"stdout:\n{_tail(out)}\nstderr:\n{_tail(err)}") from None
            time.sleep(0.25)


def group_alive(pgid) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc, grace=20.0) -> None:
    """Ctrl+C as the newcomer's terminal sends it: SIGINT to the whole process group (scripts/run,
    web, worker), then SIGKILL what is left. (A SIGTERM to the whole group is no Ctrl+C: it reaches
    the worker's own processes before its main one, and django-q2's stop then hangs until the
    SIGKILL — the grace, every run.)"""
    pgid = proc.pid  # start_new_session: the group is the child's pid
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        proc.poll()
        time.sleep(0.2)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


@pytest.mark.timeout(FIRST_RUN_TIMEOUT + HTTP_TIMEOUT + 120)
def test_a_fresh_clone_runs_with_the_readme_command_and_the_printed_login_works(tmp_path):
    """`scripts/run` in a fresh clone with no environment → demo login works."""
    clone = tmp_path / "trellis"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    assert "scripts/run" in (clone / "README.md").read_text(), "the README's quick start names scripts/run"

    port = free_port()
    out, err = tmp_path / "run.stdout", tmp_path / "run.stderr"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            ["scripts/run", "--port", str(port)], cwd=clone, env=newcomer_env(),
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
        )
    try:
        url, username, password = wait_for_login_line(proc, out, err, port, FIRST_RUN_TIMEOUT)
        assert username == "demo"

        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar := http.cookiejar.CookieJar()))
        status, _, html = get_when_up(opener, urllib.parse.urljoin(url, "accounts/login/"), proc, HTTP_TIMEOUT, out, err)
        assert status == 200 and 'name="username"' in html
        csrf = next((c.value for c in jar if c.name == "csrftoken"), None)
        assert csrf, "the login page sets the csrftoken cookie"

        status, landed, html = open_url(
            opener, urllib.parse.urljoin(url, "accounts/login/"),
            {"username": username, "password": password, "csrfmiddlewaretoken": csrf},
        )
        assert status == 200
        assert landed == url, f"a good login redirects to the projects page, landed on {landed}"
        assert "sessionid" in {c.name for c in jar}
        assert "Demo project" in html
        assert re.search(r'class="who"[^>]*>\s*demo\s*<', html)

        # the session is really logged in, not an accident of the redirect
        status, _, html = open_url(opener, url)
        assert status == 200 and "Demo project" in html
    finally:
        stop_group(proc)
        exited = proc.poll()
        shutil.rmtree(clone, ignore_errors=True)  # its .venv is large

    assert exited is not None, "scripts/run is still running after SIGTERM and SIGKILL"
    assert not group_alive(proc.pid), "a web or worker process outlived scripts/run"

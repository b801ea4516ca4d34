"""Shared fixtures: people and projects, an API client, and real processes.

``worker`` and ``server`` start real ``manage.py qcluster`` and ``daphne``
processes against the test database (PostgreSQL + Redis when DATABASE_URL /
REDIS_URL are set, else the SQLite file and the ORM broker), so tests that use
them see committed rows only: they run with ``transactional_db``.
"""

import json
from concurrent.futures import ThreadPoolExecutor
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

# Playwright's sync API keeps an event loop on the main thread; the ORM refuses to
# run there unless told it is safe (it is: nothing else runs on that loop).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


# `pytest -n N` (pytest-xdist) runs N test processes side by side. Each has its own test
# database (pytest-django adds gw0, gw1, … to its name) and its own worker and web processes;
# what they would share through Redis — the job queue and the channel layer — gets the same
# suffix here, before any test enqueues a task or opens the layer. The queue name is also
# django-q2's signing salt, so this process and its workers must agree on it (process_env).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if XDIST_WORKER:
    from django_q.conf import Conf

    settings.Q_CLUSTER["name"] = Conf.PREFIX = Conf.CLUSTER_NAME = f"{settings.Q_CLUSTER['name']}-{XDIST_WORKER}"
    if settings.REDIS_URL:
        layer = settings.CHANNEL_LAYERS["default"]["CONFIG"]
        layer["prefix"] = f"{layer['prefix']}-{XDIST_WORKER}"


# --- the reliability suite's figures (tests/reliability) -------------------------------

_figures: list[str] = []


def pytest_runtest_logreport(report):
    """Collect each reliability test's figure (its ``figure`` fixture), also from xdist workers."""
    if report.when == "call":
        _figures.extend(text for key, text in report.user_properties if key == "reliability_figure")


def pytest_terminal_summary(terminalreporter):
    if _figures:
        terminalreporter.section("reliability figures")
        for line in _figures:
            terminalreporter.write_line(line)


# --- people and projects ------------------------------------------------------


@pytest.fixture
def make_user(django_user_model):
    def make(username, password="pw-secret-123"):
        return django_user_model.objects.create_user(username=username, password=password)

    return make


@pytest.fixture
def team(db, make_user):
    """Project ``alpha`` with one user per role, plus an outsider who owns project ``beta``."""
    from accounts.models import Membership, Project

    alpha = Project.objects.create(slug="alpha", name="Alpha")
    beta = Project.objects.create(slug="beta", name="Beta")
    people = {name: make_user(name) for name in ("owner", "maintainer", "member", "viewer", "outsider")}
    for role in ("owner", "maintainer", "member", "viewer"):
        Membership.objects.create(user=people[role], project=alpha, role=role)
    Membership.objects.create(user=people["outsider"], project=beta, role="owner")
    return type("Team", (), {"alpha": alpha, "beta": beta, **people})


def off_the_loop(call, *args, **kwargs):
    """``call(*args, **kwargs)``, from another thread when this one runs an event loop (Playwright's
    sync API keeps one on the test's thread): the test client reaches async routes (POST turns,
    GET executions) through ``async_to_sync``, which refuses to run on such a thread."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call(*args, **kwargs)

    def in_thread():
        from django.db import connections

        try:
            return call(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(in_thread).result()


class ApiClient:
    """JSON over the real URL stack, authenticated with a real bearer token."""

    def __init__(self, client, token=None):
        self.client = client
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def get(self, path, **params):
        return off_the_loop(self.client.get, path, params, **self.headers)

    def post(self, path, data=None, raw=None):
        body = raw if raw is not None else json.dumps(data if data is not None else {})
        return off_the_loop(self.client.post, path, body, content_type="application/json", **self.headers)

    def patch(self, path, data=None):
        return off_the_loop(self.client.patch, path, json.dumps(data or {}), content_type="application/json", **self.headers)

    def delete(self, path):
        return off_the_loop(self.client.delete, path, **self.headers)

    def wait(self, execution_id, statuses=TERMINAL, timeout=30.0):
        """Poll ``GET /api/executions/{id}`` until its status is one of ``statuses``."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.get(f"/api/executions/{execution_id}").json()
            if body.get("status") in statuses:
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"execution {execution_id} still {body.get('status')!r} after {timeout}s: {body}")
            time.sleep(0.05)


def make_git_repo(root: Path, text: str, message: str) -> Path:
    """A real git repository at ``root`` with one commit of ``hello.txt`` (workspace tests)."""
    root.mkdir(parents=True)
    git = ["git", "-C", str(root)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "config", "user.name", "Test"], check=True)
    subprocess.run([*git, "config", "user.email", "test@example.com"], check=True)
    (root / "hello.txt").write_text(text)
    subprocess.run([*git, "add", "hello.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    return root


def poll(fn, *, timeout=20.0, interval=0.05, what="condition"):
    """Call ``fn`` until it returns something truthy; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


def executions(api, sid) -> list[dict]:
    """Every execution of a session, through ``GET /api/executions``."""
    r = api.get("/api/executions", session=sid, limit=500)
    assert r.status_code == 200, r.content
    return r.json()


def undelivered_results(session_ids=None) -> list[str]:
    """Finished jobs whose result the worker is still about to hand back: owed to an idle branch
    (of these sessions, or of any session) in mode ``turn`` — a follow-up turn or notice comes
    next — or in any mode to an archived branch (it is bounced). Results owed in mode
    ``mailbox`` to a live branch wait for its next turn: nothing more happens on its own."""
    from django.db.models import Q

    from collab.models import FollowupState, Job

    owed = Job.objects.filter(followup_state=FollowupState.OWED).filter(
        ~Q(followup_mode="mailbox") | Q(caller_branch__archived=True))
    if session_ids is not None:
        owed = owed.filter(caller_branch__session_id__in=list(session_ids))
    return list(owed.values_list("pk", flat=True))


def settle_session(api, *sids, quiet: float = 0.1, timeout: float = 60.0, interval: float = 0.05) -> list[dict]:
    """Wait until the sessions are at rest and return their jobs (``GET /api/executions``):
    every job terminal and no result waiting to come back to one of their branches (which
    would admit a follow-up), the same for ``quiet`` seconds (two reads at least)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while True:
        jobs = [j for sid in sids for j in executions(api, sid)]
        key = {j["id"]: j["status"] for j in jobs}
        if key != last or not all(s in TERMINAL for s in key.values()) or undelivered_results(sids):
            last, since = key, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return jobs
        assert time.monotonic() < deadline, f"sessions {sids} did not settle: {key}"
        time.sleep(interval)


_handlers: dict = {}


def shared_handler_client():
    """A test ``Client`` (its own cookies) on a request handler shared by every such client.
    Each new handler builds the middleware chain on its first request — WhiteNoise then indexes
    every static file (about 35 ms) — and the suite makes thousands of clients. A handler holds
    no per-client state (one WSGI handler serves every thread of a server the same way); a
    test that changes MIDDLEWARE gets a handler of its own."""
    from django.test import Client

    client = Client()
    key = tuple(settings.MIDDLEWARE)
    client.handler = _handlers.setdefault(key, client.handler)
    return client


@pytest.fixture
def api_as(client):
    """``api_as(user)``: the person's own client, a token with every scope (tests of roles);
    ``api_as(user, scopes=[…])`` a narrower one (tests of scopes, P-SEC-7)."""
    from accounts.models import ApiToken, TokenScope

    def make(user, scopes=None):
        _, raw = ApiToken.issue(user, name="test", scopes=scopes or TokenScope.values)
        return ApiClient(shared_handler_client(), raw)

    return make


@pytest.fixture
def browser_of(team):
    """``browser_of(user)``: a Django test client logged in as ``user`` (a person's browser)."""

    def make(user):
        from django.test import Client

        client = Client()
        client.force_login(user)
        return client

    return make


@pytest.fixture
def scripted_session(api_as, team):
    """Through the API: a project owner saves an agent spec with ``script``, then ``user``
    opens a session with it. Returns ``(api client of user, session id)``."""

    def make(user, script, project="alpha", agent_id="bot", **spec):
        admin = api_as(team.owner if project == "alpha" else team.outsider)
        r = admin.post(f"/api/projects/{project}/agent-specs", {"agent_id": agent_id, "provider": "scripted", "script": script, **spec})
        assert r.status_code == 201, r.content
        api = api_as(user)
        r = api.post(f"/api/projects/{project}/sessions", {"title": "test", "agent_id": agent_id})
        assert r.status_code == 201, r.content
        return api, r.json()["id"]

    return make


# --- real processes ---------------------------------------------------------------


def _database_url() -> str:
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(scope="session")
def process_env(django_db_setup, django_db_blocker):
    """Environment for child processes: the *test* database and this run's queue and layer."""
    with django_db_blocker.unblock():
        url = _database_url()
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DJANGO_SECRET_KEY=settings.SECRET_KEY,
        TRELLIS_QUEUE_NAME=settings.Q_CLUSTER["name"],
        TRELLIS_VAR_DIR=str(settings.VAR_DIR),
        TRELLIS_WORKERS="2",
        TRELLIS_FAST_PASSWORD_HASHER="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
        env["TRELLIS_CHANNEL_PREFIX"] = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
    return env


def _wait_for_output(log: Path, marker: str, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"process did not print {marker!r}:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


_background_worker_started = False


@pytest.fixture
def transactional_db(transactional_db):
    """pytest-django's fixture, plus: once a worker process is running in this test session, any
    job a transactional test enqueued may still be running at its end (the test need not have
    asked for ``worker``), so let it go quiet before the database is flushed."""
    yield transactional_db
    if _background_worker_started:
        settle_worker()


@pytest.fixture(scope="session")
def worker_process(process_env, tmp_path_factory):
    log = tmp_path_factory.mktemp("worker") / "qcluster.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "qcluster"], env=process_env, cwd=ROOT,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    _wait_for_output(log, "running.", proc, 60)
    proc.log = log
    global _background_worker_started
    _background_worker_started = True
    yield proc
    _stop(proc)


@pytest.fixture
def worker(transactional_db, worker_process):
    """A real django-q2 worker process serving this test (rows must be committed).

    On teardown (see ``transactional_db``) everything the test left running is cancelled and
    the worker is given time to go quiet, so the database flush never races a turn still
    writing (a deadlock on PostgreSQL, stray rows on SQLite)."""
    assert worker_process.poll() is None, worker_process.log.read_text()[-3000:]
    return worker_process


def queued_tasks() -> int:
    """Tasks in this run's broker list: with the ORM broker (SQLite) until the worker has
    finished them (rows are deleted on acknowledgement), with Redis until a worker takes them."""
    from datetime import timedelta

    from django.db.models import Q
    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.models import OrmQ

    broker = get_broker()
    if settings.Q_CLUSTER.get("orm"):
        # a row is claimable (lock in the past) or taken (lock = claim time + RETRY); a row
        # enqueued while a test set the app's clock ahead has a lock minutes ahead: it is
        # neither (no worker takes it before that time), so it is not waited for
        now = timezone.now()
        taken = now + timedelta(seconds=settings.Q_CLUSTER["retry"] / 2)
        return OrmQ.objects.filter(key=broker.list_key).filter(Q(lock__lte=now) | Q(lock__gt=taken)).count()
    return broker.queue_size()


def at_rest(broker: bool = True) -> bool:
    """Nothing left for the workers: no open job, no result about to come back, no queued task
    (``broker=False``: whatever the broker holds, e.g. tasks taken by a worker that was killed)."""
    from collab.models import OPEN_STATUSES, Job

    return (not Job.objects.filter(status__in=OPEN_STATUSES).exists() and not undelivered_results()
            and not (broker and queued_tasks()))


def wait_at_rest(timeout: float = 20.0, *, cancel: bool = False, broker: bool = True) -> bool:
    """Wait until ``at_rest()`` holds twice in a row 0.1 s apart (a task a worker has just taken
    from Redis shows in neither queue nor jobs for a moment); ``cancel``: cancel every open job
    meanwhile. Whether it came to rest within ``timeout``."""
    from django.db import transaction

    from collab.models import OPEN_STATUSES, Job
    from collab.services.cancel import request_cancel_tree

    deadline = time.monotonic() + timeout
    in_a_row = 0
    while time.monotonic() < deadline:
        if at_rest(broker):
            in_a_row += 1
            if in_a_row >= 2:
                return True
        else:
            in_a_row = 0
            for job in Job.objects.filter(status__in=OPEN_STATUSES) if cancel else ():
                try:
                    with transaction.atomic():
                        request_cancel_tree(Job.objects.select_for_update().get(pk=job.pk))
                except Exception:  # it ended meanwhile: fine
                    pass
        time.sleep(0.1)
    return False


def settle_worker(timeout: float = 20.0) -> None:
    """Cancel whatever the test left open and wait until the workers are at rest (at once when
    the test made no job at all), so the flush that ends a transactional test races nothing."""
    from collab.models import Job

    if Job.objects.exists() or queued_tasks():
        wait_at_rest(timeout, cancel=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server_process(process_env, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "daphne.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            env=process_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.1)
    proc.url = f"http://127.0.0.1:{port}"
    proc.log = log
    yield proc
    _stop(proc)


@pytest.fixture
def server(transactional_db, server_process):
    """A real daphne process (HTTP + WebSocket) on the test database; ``server.url``."""
    assert server_process.poll() is None, server_process.log.read_text()[-3000:]
    return server_process


# --- browser --------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


# Module scope, not session: Playwright's sync API keeps an event loop running on the main
# thread while it is open, which would break async_to_sync in the tests that follow.
@pytest.fixture(scope="module")
def _playwright():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(_playwright):
    browser = _playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield browser
    browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()

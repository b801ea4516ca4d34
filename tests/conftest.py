"""Shared fixtures: people and projects, an API client, and real processes.

``worker`` and ``server`` start real ``manage.py qcluster`` and ``daphne``
processes against the test database (PostgreSQL + Redis when DATABASE_URL /
REDIS_URL are set, else the SQLite file and the ORM broker), so tests that use
them see committed rows only: they run with ``transactional_db``.

``SharedWorld`` builds a module's expensive read-only rows once for the tests that only read
them (Django's ``setUpTestData``): each such test runs in a savepoint of the world's outer
transaction. A transactional test never runs inside one (it is rolled back before).
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
from django.db import connection, connections, transaction
from django.test import TransactionTestCase

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


# What a test run shares with other runs on this machine gets a name of its own, here and not in
# settings (which know nothing of pytest), before any test creates the database, enqueues a task
# or opens the layer: the test database and, unless TRELLIS_QUEUE_NAME names one, the job queue
# get this process's id. `pytest -n N` (pytest-xdist) runs N test processes side by side; each
# has its own test database (pytest-django adds gw0, gw1, … to its name) and its own worker and
# web processes, and what they would share through Redis — the job queue and the channel layer —
# gets the worker's name too. The queue name is also django-q2's signing salt, so this process
# and its workers must agree on it (process_env). Test runs create many users: a cheap hasher.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _isolate_this_run() -> None:
    from django.contrib.auth.hashers import get_hashers
    from django_q.conf import Conf

    pid = os.getpid()
    test_db = settings.DATABASES["default"]["TEST"]
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        name = Path(test_db["NAME"])
        test_db["NAME"] = str(name.with_name(f"{name.stem}-{pid}{name.suffix}"))
    else:
        test_db["NAME"] = f"{test_db['NAME']}_{pid}"
    queue = settings.Q_CLUSTER["name"] if os.environ.get("TRELLIS_QUEUE_NAME") else f"{settings.Q_CLUSTER['name']}-{pid}"
    if XDIST_WORKER:
        queue = f"{queue}-{XDIST_WORKER}"
        if settings.REDIS_URL:
            layer = settings.CHANNEL_LAYERS["default"]["CONFIG"]
            layer["prefix"] = f"{layer['prefix']}-{XDIST_WORKER}"
    settings.Q_CLUSTER["name"] = Conf.PREFIX = Conf.CLUSTER_NAME = queue
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher",
                                 "django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    get_hashers.cache_clear()


_isolate_this_run()


# --- emptying the database after a transactional test ---------------------------------------
#
# Django's TransactionTestCase ends with ``manage.py flush``: TRUNCATE of every table, then the
# post_migrate signal re-creating every content type and permission. On PostgreSQL that costs
# about 650 ms a test (a TRUNCATE makes new files for each of ~35 tables), the largest single
# item of the suite's time (~750 such tests). The tables a test writes are small, so deleting
# their rows in one transaction, foreign keys checked at its commit (Django makes them
# DEFERRABLE INITIALLY DEFERRED), takes about 10 ms and leaves the database as empty. Content
# types and permissions are kept instead of being dropped and made again with new ids (which
# also keeps the worker and web processes' cached ids right).
KEPT_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission"})


def empty_database(connection) -> None:
    """Delete every row the tests may have written, in one transaction."""
    tables = [name for name in connection.introspection.django_table_names(only_existing=True, include_views=False)
              if name not in KEPT_TABLES]
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED" if connection.vendor == "postgresql"
                       else "PRAGMA defer_foreign_keys = ON")
        for name in tables:
            cursor.execute(f"DELETE FROM {connection.ops.quote_name(name)}")


def _fixture_teardown(self):
    for alias in self._databases_names(include_mirrors=False):
        empty_database(connections[alias])


TransactionTestCase._fixture_teardown = _fixture_teardown


# --- the reliability suite's figures (tests/reliability) -------------------------------

_figures: list[str] = []


PAIRED_RUN = os.environ.get("TRELLIS_PAIRED_RUN", "")  # scripts/test runs both databases: this is that run


def pytest_collection_modifyitems(config, items):
    """A test marked ``one_database`` proves nothing about the database under it: when
    scripts/test runs the suite on both databases, it runs in one of the two runs only (the
    marker's ``run``, PostgreSQL unless it says ``"sqlite"``); run alone, pytest runs it."""
    if not PAIRED_RUN:
        return
    for item in items:
        marker = item.get_closest_marker("one_database")
        if marker is None:
            continue
        run = marker.kwargs.get("run") or (marker.args[0] if marker.args else "postgres")
        if run != PAIRED_RUN:
            item.add_marker(pytest.mark.skip(reason=f"proves nothing about the database: runs in the {run} run"))


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
    return make_team(make_user)


def copy_of_team(team):
    """A ``team`` of a ``SharedWorld`` for one test: the same rows, model instances of its own."""
    import copy

    return type("Team", (), {k: copy.deepcopy(v) for k, v in vars(team).items() if not k.startswith("__")})


def make_team(make_user):
    """``team``'s rows, made with ``make_user(username)`` (also outside a test: ``SharedWorld``)."""
    from accounts.models import Membership, Project

    alpha = Project.objects.create(slug="alpha", name="Alpha")
    beta = Project.objects.create(slug="beta", name="Beta")
    people = {name: make_user(name) for name in ("owner", "maintainer", "member", "viewer", "outsider")}
    for role in ("owner", "maintainer", "member", "viewer"):
        Membership.objects.create(user=people[role], project=alpha, role=role)
    Membership.objects.create(user=people["outsider"], project=beta, role="owner")
    return type("Team", (), {"alpha": alpha, "beta": beta, **people})


class SharedWorld:
    """Rows built once and read by a run of tests, like Django's ``TestCase.setUpTestData``.

    ``SharedWorld(uses, build)``: ``uses(item)`` says whether a test reads the world (decided from
    its fixtures before it runs); ``build(request)`` makes the rows and returns Python objects describing
    them. The first such test opens an outer transaction (``transaction.atomic()``) and builds the
    world in it; every such test then runs in its own ``db`` transaction, a savepoint inside that
    one, so what it writes is rolled back and the next test sees the world as built. After the
    last test of a run of consecutive tests of one module that read it, the outer transaction is
    rolled back (``pytest_runtest_teardown`` below): a test that does not read it — one that
    commits (``transactional_db``, ``worker``, ``server``) or builds its rows itself — never
    runs inside it. As in any ``db`` test, ``on_commit`` callbacks never run unless captured
    (``django_capture_on_commit_callbacks``). What ``build`` returns is shared: the fixtures
    that hand it to a test give each test its own copy (``copy.deepcopy`` of model instances).

    ``get(request)`` is called by a function-scoped fixture *before* the test's ``db`` fixture
    (list it first among the fixtures that need ``db``); it fails loudly if the test's own
    transaction is already open, since the world would then be built inside it."""

    open_worlds: list["SharedWorld"] = []

    def __init__(self, uses, build):
        self.uses, self.build = uses, build
        self.module = self.value = self._atomic = self._blocker = None

    def get(self, request):
        from django.db import connection, transaction

        if self._atomic is None:
            assert not connection.in_atomic_block, "SharedWorld.get ran inside the test's transaction"
            self._blocker = request.getfixturevalue("django_db_blocker")
            request.getfixturevalue("django_db_setup")
            self._blocker.unblock()
            self._atomic = transaction.atomic()
            self._atomic.__enter__()
            self.module = request.node.module
            SharedWorld.open_worlds.append(self)
            # rolled back with the module at the latest: before session fixtures drop the database
            request.node.getparent(pytest.Module).addfinalizer(self.close)
            try:
                self.value = self.build(request)
            except BaseException:
                self.close()
                raise
        assert len(connection.atomic_blocks) == 1, "SharedWorld.get ran inside the test's transaction"
        return self.value

    def close(self) -> None:
        from django.db import transaction

        if self._atomic is None:
            return
        atomic, self._atomic, self.value, self.module = self._atomic, None, None, None
        SharedWorld.open_worlds.remove(self)
        try:
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)
        finally:
            self._blocker.restore()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Roll back each open ``SharedWorld`` once the test after this one does not read it: after
    this test's own fixtures (its ``db`` savepoint) are gone. (At the end of its module a world is
    rolled back by the module's finalizer, before the session's fixtures are torn down.)"""
    try:
        return (yield)
    finally:
        for world in list(SharedWorld.open_worlds):
            if nextitem is None or nextitem.module is not world.module or not world.uses(nextitem):
                world.close()


@pytest.fixture(autouse=True)
def _a_channel_layer_per_test():
    """Each test gets a channel layer of its own. The process's layer outlives the event loop of
    the test that used it (a test runs its async parts on a loop of its own), and channels-redis
    keeps a per-channel lock across loops: a read waiting for that lock when its loop ends leaves
    the lock bound to the dead loop, and the next loop that contends for it fails ("bound to a
    different event loop"). A server runs one loop for its life and never meets this; a test
    process must start each test afresh, as a new server process would."""
    yield
    from channels.layers import channel_layers

    channel_layers.backends.clear()


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

    def wait(self, execution_id, statuses=TERMINAL, timeout=None):
        """Poll ``GET /api/executions/{id}`` until its status is one of ``statuses``."""
        timeout = WAIT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if _inline_worker:
            _inline_worker[-1]()  # no worker process: the queued work runs here first
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


# Generous for a loaded machine (two suites side by side on two cores); never reached when
# things work: every wait below returns as soon as its condition holds.
WAIT = 60.0


def poll(fn, *, timeout=WAIT, interval=0.05, what="condition"):
    """Call ``fn`` until it returns something truthy; fail with the last value after ``timeout``."""
    if _inline_worker:
        _inline_worker[-1]()
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


def executions(api, sid, status=None) -> list[dict]:
    """Every execution of a session (optionally in one status), through ``GET /api/executions``."""
    params = {"session": sid, "limit": 500}
    if status:
        params["status"] = status
    r = api.get("/api/executions", **params)
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
    if _inline_worker:
        _inline_worker[-1]()
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


# --- scenario helpers: the public API as a test drives it ------------------------------------


def make_spec(api, agent_id, script=(), project="alpha", **fields) -> dict:
    """``POST /api/projects/{project}/agent-specs``: a scripted agent
    (docs/contract.md#the-scripted-provider) named ``agent_id``."""
    body = {"agent_id": agent_id, "provider": "scripted",
            "script": script if isinstance(script, dict) else list(script), **fields}
    r = api.post(f"/api/projects/{project}/agent-specs", body)
    assert r.status_code == 201, r.content
    return r.json()


def open_session(api, agent_id, title="s", project="alpha") -> str:
    """``POST /api/projects/{project}/sessions`` with the saved agent ``agent_id``: the session id."""
    r = api.post(f"/api/projects/{project}/sessions", {"title": title, "agent_id": agent_id})
    assert r.status_code == 201, r.content
    return r.json()["id"]


def start_turn(api, sid, prompt="go", **extra):
    """``POST /api/sessions/{sid}/turns``: the response, whatever it is."""
    return api.post(f"/api/sessions/{sid}/turns", {"prompt": prompt, **extra})


def turn(api, sid, prompt="go", **extra) -> str:
    """A user turn that must be accepted: its execution id."""
    r = start_turn(api, sid, prompt, **extra)
    assert r.status_code == 202, r.content
    return r.json()["execution_id"]


def execution(api, eid) -> dict:
    r = api.get(f"/api/executions/{eid}")
    assert r.status_code == 200, r.content
    return r.json()


def cancel(api, eid, version=None, command_id=None, **overrides):
    """``POST /api/executions/{id}/commands`` with ``execution.cancel`` (version read now if not
    given): the response."""
    import uuid

    if version is None:
        version = execution(api, eid)["version"]
    body = {"command_id": command_id or f"cmd-{uuid.uuid4().hex}", "action": "execution.cancel",
            "expected_version": version, "payload": {}}
    body.update(overrides)
    return api.post(f"/api/executions/{eid}/commands", body)


def tool(api, address, name, **arguments) -> dict:
    """Run a collab tool as the branch at ``address`` through the tool gateway: its result."""
    r = api.post(f"/api/branches/{address}/tools/{name}", {"arguments": arguments})
    assert r.status_code == 200, (name, r.status_code, r.content)
    return r.json()


def agent_call(prompt, agent_id="", background=True, **extra) -> dict:
    """A scripted ``agent`` tool call (a background one unless ``background=False``)."""
    arguments = {"prompt": prompt, **extra}
    if agent_id:
        arguments["agent_id"] = agent_id
    if background:
        arguments["run_in_background"] = True
    return {"name": "agent", "arguments": arguments}


def step(*calls) -> dict:
    """A scripted step making these tool calls."""
    return {"tool_calls": list(calls)}


def address_of(job: dict) -> str:
    """``SID:HEAD`` of the branch an execution ran on (a stale head still finds the branch)."""
    assert job["prompt_msg"], job
    return f"{job['session']}:{job['prompt_msg']}"


def transcript_messages(api, address) -> list[dict]:
    """Every message of a branch's transcript, in order, unabridged."""
    r = api.get(f"/api/branches/{address}/transcript", max_chars=10_000_000)
    assert r.status_code == 200, r.content
    return [m for t in r.json()["turns"] for m in t["messages"]]


def tool_results(job_id) -> list[dict]:
    """The tool-result nodes a turn wrote, in order: ``{"tool", "is_error", "code", "details", "text"}``."""
    from collab.models import Message

    out = []
    for m in Message.objects.filter(job_id=job_id, role="tool").order_by("depth"):
        meta = m.metadata or {}
        details = meta.get("details") or {}
        out.append({"tool": meta.get("tool"), "is_error": meta.get("is_error"), "code": details.get("code"),
                    "details": details, "text": m.text})
    return out


def set_limits(owner_api, project="alpha", **limits) -> dict:
    """``PATCH /api/projects/{project}/limits`` as its owner: the limits now in force."""
    r = owner_api.patch(f"/api/projects/{project}/limits", limits)
    assert r.status_code == 200, r.content
    return r.json()


def events(api, sid, after=0) -> list[dict]:
    """Every event of a session after ``after``, following the API's pages."""
    out = []
    while True:
        r = api.get(f"/api/sessions/{sid}/events", after=after)
        assert r.status_code == 200, r.content
        page = r.json()["events"]
        if not page:
            return out
        out += page
        after = page[-1]["seq"]


def branches(api, sid, scope="session") -> list[dict]:
    r = api.get(f"/api/sessions/{sid}/branches", scope=scope)
    assert r.status_code == 200, r.content
    return r.json()


def settle(api, *sids, timeout=WAIT) -> list[dict]:
    """Every job of these sessions once they are at rest (``settle_session``)."""
    return settle_session(api, *sids, timeout=timeout)


_inline_worker: list = []  # the running test's ``run_queued``, if it asked for one


@pytest.fixture
def run_queued(db, django_capture_on_commit_callbacks, monkeypatch):
    """The worker's part, in this process and in the test's transaction (no worker process, no
    flush): ``run_queued()`` runs every queued job to its end with ``run_job``, exactly as a
    worker would, one at a time, oldest first, and then the jobs those created (a background
    child, a follow-up turn, a message's delivery), until none is left; it returns their ids in
    the order they ran. What commits during a job (a result owed to an idle caller becomes its
    follow-up turn) runs when that job's transaction would have committed. One job at a time is
    one legal schedule of a worker: a test that needs two turns running side by side (a cancel
    landing mid-turn, a ``wait_agent`` on a running child) needs the ``worker`` process.

    While it is in use, ``ApiClient.wait`` and ``settle_session`` call it before they look, and so
    does a foreground ``agent`` call through the gateway before it waits for its child (which a
    worker runs), so a test written against the ``worker`` process reads the same with this
    fixture instead."""
    from collab import gateway
    from collab.models import Job, JobStatus
    from collab.runtime.loop import run_job

    def run(limit: int = 200) -> list[str]:
        ran: list[str] = []
        refused: set[str] = set()
        while True:
            queued = (Job.objects.filter(status=JobStatus.QUEUED).exclude(pk__in=refused)
                      .order_by("created_at", "pk").values_list("pk", flat=True).first())
            if queued is None:
                forget_handed_over_tasks()
                return ran
            assert len(ran) < limit, f"more than {limit} jobs ran: a loop? {ran[-10:]}"
            with django_capture_on_commit_callbacks(execute=True):
                status = run_job(queued)
            if status is None:
                refused.add(queued)  # not claimable now (its caller fenced it, no free slot, …)
            else:
                ran.append(queued)
                refused.clear()  # what ended may have freed a slot or a branch

    def forget_handed_over_tasks() -> None:
        # What those commits handed to the broker has run here already: left there, it would keep
        # ``queued_tasks`` above zero, and in Redis (outside the test's transaction) name rows that
        # a worker process of a later test never sees. (The ORM broker's rows are the test's own.)
        from django_q.brokers import get_broker

        get_broker().purge_queue()

    def gateway_waits(check, timeout_seconds, **kwargs):
        run()
        return waits(check, timeout_seconds, **kwargs)

    waits = gateway.wait_for_change
    monkeypatch.setattr(gateway, "wait_for_change", gateway_waits)
    _inline_worker.append(run)
    yield run
    _inline_worker.remove(run)


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
    ``api_as(user, scopes=[…])`` a narrower one (tests of scopes)."""
    return api_client_of


def api_client_of(user, scopes=None) -> ApiClient:
    """``api_as(user, scopes)`` without the fixture (``SharedWorld`` builders)."""
    from accounts.models import ApiToken, TokenScope

    _, raw = ApiToken.issue(user, name="test", scopes=scopes or TokenScope.values)
    return ApiClient(shared_handler_client(), raw)


@pytest.fixture
def browser_of(team):
    """``browser_of(user)``: a Django test client logged in as ``user`` (a person's browser)."""
    return browser_client


def browser_client(user):
    """``browser_of(user)`` without the fixture (``SharedWorld`` builders)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def scripted_session(api_as, team):
    """Through the API: a project owner saves an agent spec with ``script``, then ``user``
    opens a session with it. Returns ``(api client of user, session id)``."""
    return scripted_sessions(api_as, team)


def scripted_sessions(api_as, team):
    """``scripted_session`` without the fixtures (``SharedWorld`` builders)."""

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


WEBHOOK_TEST_HOSTS = "127.0.0.1:*,localhost:*"


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
        # the webhook tests' receivers listen on loopback (tests/collab/test_webhooks.py); their
        # retries go out on the first reconcile pass after a failure
        TRELLIS_WEBHOOK_HOSTS=WEBHOOK_TEST_HOSTS,
        TRELLIS_WEBHOOK_RETRY_BASE_SECONDS="1",
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


def taken_tasks(list_key: str | None = None) -> list[int]:
    """The ORM broker's rows of a list (this run's unless named) that a worker has taken and
    not yet acknowledged: their lock is the claim time + RETRY (over an hour ahead). A worker
    SIGKILLed mid-task never acknowledges its row, which ``queued_tasks`` then counts for half
    that time though the reconciler recovered its job: a test that kills a worker takes these
    right after the kill and drops them (``drop_tasks``). With Redis a taken task has left the
    list already: none."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.models import OrmQ

    if not settings.Q_CLUSTER.get("orm"):
        return []
    ahead = timezone.now() + timedelta(seconds=settings.Q_CLUSTER["retry"] / 2)
    return list(OrmQ.objects.filter(key=get_broker(list_key).list_key, lock__gt=ahead).values_list("pk", flat=True))


def drop_tasks(pks) -> None:
    """Delete these broker rows (``taken_tasks``). A live worker still running one of them loses
    nothing: acknowledging deletes the row, and whether its job ended is read from the job."""
    from django_q.models import OrmQ

    OrmQ.objects.filter(pk__in=list(pks)).delete()


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


def start_daphne(env: dict, port: int, log: Path):
    """A daphne process on ``port`` (output appended to ``log``), once it accepts connections."""
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def server_process(process_env, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "daphne.log"
    proc = start_daphne(process_env, port, log)
    proc.url = f"http://127.0.0.1:{port}"
    proc.log = log
    yield proc
    _stop(proc)


@pytest.fixture
def server(transactional_db, server_process):
    """A real daphne process (HTTP + WebSocket) on the test database; ``server.url``."""
    assert server_process.poll() is None, server_process.log.read_text()[-3000:]
    return server_process

"""Trellis settings.

With no environment at all this is the *embedded default* (docs/contract.md#deployments):
SQLite under ``var/``, django-q2's ORM broker, an in-process channel layer plus
the database event relay, the scripted model, 127.0.0.1 only.

Scaled: ``DATABASE_URL`` (postgres://… or sqlite:///path),
``REDIS_URL`` (channels-redis layer + django-q2 Redis broker),
``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``.
"""

import importlib.util
import json
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from collab.conf.env import env_bool, env_decimal, env_int, env_list, env_str
from collab.conf.model_connections import model_connections_from_env
from collab.conf.otel import traces_from_env
from collab.conf.webhook_hosts import webhook_hosts_from_env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("TRELLIS_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_str("REDIS_URL")

DEBUG = env_bool("DJANGO_DEBUG", False)

def _secret_key() -> str:
    """The env key, or (embedded only) one generated once and kept in var/.

    Web and worker processes must share the key, so it cannot be random per
    process; a scaled deployment must set it explicitly.
    """
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    if DATABASE_URL and not DEBUG and not env_bool("TRELLIS_ALLOW_GENERATED_SECRET", False):
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DATABASE_URL is set and DEBUG is off")
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1"])
if "*" in ALLOWED_HOSTS and not DEBUG:
    raise ImproperlyConfigured('DJANGO_ALLOWED_HOSTS="*" is only allowed with DJANGO_DEBUG=1')
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "corsheaders",
    "template_partials",
    "channels",
    "django_q",
    "ninja",  # its own swagger-ui files (static/ninja/): /api/docs works without a CDN
    "accounts",
    "collab",
    "axes",
]

# Framework behaviour Trellis replaces (docs/infrastructure.md), each named here to restore the
# stock path: comma-separated, e.g. TRELLIS_STOCK=prepared,middleware. Read at start-up.
STOCK_PATHS = ("task_queue", "prepared", "request_threads", "middleware", "channel_layer", "push_loop", "brokers",
               "worker_name", "search_literals")
TRELLIS_STOCK = frozenset(env_list("TRELLIS_STOCK", []))
if TRELLIS_STOCK - set(STOCK_PATHS):
    raise ImproperlyConfigured(f"TRELLIS_STOCK names unknown paths {sorted(TRELLIS_STOCK - set(STOCK_PATHS))}: "
                               f"known are {', '.join(STOCK_PATHS)}")

MIDDLEWARE = [
    "corsheaders.middleware.CorsMiddleware",  # /lg only (CORS_URLS_REGEX); async-capable, no I/O
    "collab.middleware.ApiErrorShapeMiddleware",  # the APIs' 404 and 405 as JSON (under CORS: it adds its headers)
    # Django's own, run on the event loop under ASGI where they do no I/O (collab.middleware.OnTheLoop)
    "collab.middleware.SecurityMiddleware",
    "collab.security_headers.ContentSecurityPolicyMiddleware",
    "collab.middleware.StaticFilesMiddleware",  # WhiteNoise, async-capable
    "collab.middleware.CleanInputMiddleware",
    "collab.middleware.SessionMiddleware",
    "collab.middleware.CommonMiddleware",
    "collab.middleware.CsrfViewMiddleware",
    "collab.middleware.AuthenticationMiddleware",
    "collab.middleware.MessageMiddleware",
    "collab.middleware.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "collab.middleware.DomainErrorMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks
]
if "middleware" in TRELLIS_STOCK:  # Django's and WhiteNoise's own classes (ours hop as Django's do)
    MIDDLEWARE = [{"collab.middleware.SecurityMiddleware": "django.middleware.security.SecurityMiddleware",
                   "collab.middleware.StaticFilesMiddleware": "whitenoise.middleware.WhiteNoiseMiddleware",
                   "collab.middleware.SessionMiddleware": "django.contrib.sessions.middleware.SessionMiddleware",
                   "collab.middleware.CommonMiddleware": "django.middleware.common.CommonMiddleware",
                   "collab.middleware.CsrfViewMiddleware": "django.middleware.csrf.CsrfViewMiddleware",
                   "collab.middleware.AuthenticationMiddleware":
                       "django.contrib.auth.middleware.AuthenticationMiddleware",
                   "collab.middleware.MessageMiddleware": "django.contrib.messages.middleware.MessageMiddleware",
                   "collab.middleware.XFrameOptionsMiddleware":
                       "django.middleware.clickjacking.XFrameOptionsMiddleware"}.get(name, name)
                  for name in MIDDLEWARE]

ROOT_URLCONF = "config.urls"

# Browsers may call the LangGraph-compatible API from other origins (a chat front end such as
# Agent Chat UI on a port of its own: docs/langgraph.md#chat-front-ends). /lg takes a token only,
# never the session cookie, and no credentials are allowed cross-origin: a page of another origin
# gains nothing there without a token of its own. TRELLIS_LG_CORS_ORIGINS narrows it to a list.
CORS_URLS_REGEX = r"^/lg/.*$"
_LG_ORIGINS = env_list("TRELLIS_LG_CORS_ORIGINS", ["*"])
CORS_ALLOW_ALL_ORIGINS = _LG_ORIGINS == ["*"]
CORS_ALLOWED_ORIGINS = [] if CORS_ALLOW_ALL_ORIGINS else _LG_ORIGINS
CORS_ALLOW_CREDENTIALS = False
CORS_ALLOW_HEADERS = ("accept", "authorization", "content-type", "x-api-key", "last-event-id", "x-request-id")
CORS_EXPOSE_HEADERS = ("content-location", "location", "x-pagination-next")
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _databases() -> dict:
    url = DATABASE_URL or f"sqlite:///{VAR_DIR / 'trellis.sqlite3'}"
    try:
        db = dj_database_url.parse(url, conn_max_age=env_int("DB_CONN_MAX_AGE", 0, minimum=0))
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {exc}") from None
    if db["ENGINE"] == "django.db.backends.sqlite3":
        # Web, worker and relay write concurrently: WAL lets readers proceed, IMMEDIATE
        # takes the write lock at BEGIN (no deadlock-prone lock upgrades), and the
        # busy timeout makes writers wait instead of failing with "database is locked".
        db["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;",
        }
        # Tests with real worker processes need a file, not :memory:.
        db["TEST"] = {"NAME": str(Path(db["NAME"]).with_name(f"{Path(db['NAME']).stem}-test.sqlite3"))}
    elif db["ENGINE"] == "django.db.backends.postgresql":
        db.setdefault("OPTIONS", {})
        db["OPTIONS"].update(_prepared_statements())
        db["TEST"] = {"NAME": f"test_{db['NAME']}"}
        pool = _pool_options(db)
        if pool:
            db["OPTIONS"]["pool"] = pool
    else:
        raise ImproperlyConfigured(f"unsupported database engine {db['ENGINE']!r}: use postgres:// or sqlite://")
    if _explicit_pool_size() and db["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DB_POOL_MAX_SIZE needs a PostgreSQL DATABASE_URL (psycopg's connection pool)")
    return {"default": db}


def _prepared_statements() -> dict:
    """Server-side binding, so psycopg prepares a statement a connection runs
    ``DB_PREPARE_THRESHOLD`` times (default 5) and PostgreSQL parses and plans it once
    (a turn's 19 statements took 10.5 ms of database time per turn, 6.7 ms
    prepared). On by default; ``DB_PREPARE_THRESHOLD=0`` turns it off (Django's default:
    parameters bound client-side, nothing prepared) — for a pooler in transaction mode that does
    not track prepared statements (PgBouncer before 1.21, or without ``max_prepared_statements``)."""
    threshold = env_int("DB_PREPARE_THRESHOLD", 5, minimum=0)
    if not threshold:
        return {}
    return {"server_side_binding": True, "prepare_threshold": threshold}


DB_POOL_DEFAULT_SIZE = 8


def _explicit_pool_size() -> int:
    return env_int("DB_POOL_MAX_SIZE", 0, minimum=0)


def _pool_options(db: dict) -> dict | None:
    """psycopg's connection pool for a PostgreSQL database: on by default, ``DB_POOL_MAX_SIZE``
    (default 8) connections per process, web and worker alike; ``DB_POOL_MAX_SIZE=0`` turns it
    off, and so does ``DB_CONN_MAX_AGE`` > 0 unless a pool size is set too (then it is an error).

    A worker runs many turns at once (``TRELLIS_TURNS_PER_WORKER``), and each gives its
    connection back whenever it waits (a model call, a sleep, a blocking tool): the pool bounds
    the connections of a process, whatever the turns in flight — 3 processes x 8 = 24 for the
    default deployment.

    Under ASGI each request's database work runs in a thread that closes its connection when it is
    done (``collab.realtime.threads``: nothing is held across a wait), so with ``DB_CONN_MAX_AGE=0`` every
    request opened a new PostgreSQL connection, several per ``?wait=`` turn (5–14 ms each
    here); Django's docs name the backend's pool as the way to keep connections under
    ASGI, where persistent connections are not for use. With the pool, closing a connection hands it
    back: a waiting request still holds none. A worker process opens its pool after django-q2
    forked it (``collab.apps``): a pool's connections and threads do not survive a fork."""
    raw = os.environ.get("DB_POOL_MAX_SIZE", "").strip()
    max_size = env_int("DB_POOL_MAX_SIZE", 0 if db.get("CONN_MAX_AGE") else DB_POOL_DEFAULT_SIZE, minimum=0)
    if not max_size:
        return None
    if raw and db.get("CONN_MAX_AGE"):
        raise ImproperlyConfigured("DB_POOL_MAX_SIZE and DB_CONN_MAX_AGE exclude each other: "
                                   "pooled connections are kept by the pool (set DB_CONN_MAX_AGE=0)")
    min_size = env_int("DB_POOL_MIN_SIZE", min(2, max_size), minimum=0)
    if min_size > max_size:
        raise ImproperlyConfigured(f"DB_POOL_MIN_SIZE ({min_size}) must not exceed DB_POOL_MAX_SIZE ({max_size})")
    if importlib.util.find_spec("psycopg_pool") is None:
        raise ImproperlyConfigured("DB_POOL_MAX_SIZE needs the psycopg-pool package (pip install 'psycopg[pool]')")
    return {"min_size": min_size, "max_size": max_size,
            # a thread that finds every connection taken waits this long, then its request fails
            "timeout": env_int("DB_POOL_TIMEOUT", 10, minimum=1)}


DATABASES = _databases()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
if env_bool("TRELLIS_FAST_PASSWORD_HASHER", False):
    # Test runs (tests/conftest.py sets this for itself and the processes it starts) create
    # many users: a cheap hasher first.
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]
# Login throttling (django-axes): after TRELLIS_LOGIN_FAILURE_LIMIT failures for one
# username from one address, logins for that pair answer 429 until the cool-off has passed. Locking
# the pair (not the username alone) keeps a stranger from locking a person out from elsewhere.
# Bearer tokens never go through authenticate() and are not affected.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("TRELLIS_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_int("TRELLIS_LOGIN_COOLOFF_MINUTES", 15, minimum=1) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False  # no start-up banner in every manage.py command

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "collab:projects"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# Cookies are Secure unless debugging or serving loopback only (the embedded default
# speaks plain http on 127.0.0.1); behind TLS set DJANGO_ALLOWED_HOSTS to the real names.
_LOOPBACK_ONLY = all(h in ("localhost", "127.0.0.1", "[::1]", "::1") for h in ALLOWED_HOSTS)
_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG and not _LOOPBACK_ONLY)
SESSION_COOKIE_SECURE = _SECURE
CSRF_COOKIE_SECURE = _SECURE
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# HSTS whenever cookies are secure (served over TLS); a year unless DJANGO_HSTS_SECONDS says otherwise.
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000 if _SECURE else 0, minimum=0)
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    # only behind a proxy that sets (and strips clients') X-Forwarded-Proto: requests count as https
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- live events -----------------------------------------------------------
CHANNEL_REDIS_SOCKET_TIMEOUT = 15  # seconds; channels-redis blocks 5 s (brpop_timeout) per receive
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "collab.infra.channel_layer.RedisChannelLayer",  # channels-redis's, + a blocking group_send
            # socket_timeout: redis-py 8 reads with a 5 s timeout by default, the length of the
            # BZPOPMIN channels-redis blocks in while a channel is idle — the read then raised
            # "Timeout reading from …" into whichever consumer was receiving, killing it
            # (django/channels_redis#422). Longer than that wait, still bounded for a dead server.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_REDIS_SOCKET_TIMEOUT}],
                       "prefix": env_str("TRELLIS_CHANNEL_PREFIX", "trellis")},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Without a shared channel layer, events written by the worker process reach the
# web process through the database: each web process polls for new events of
# the sessions its sockets watch (collab/realtime/relay.py).
TRELLIS_EVENT_POLL = env_bool("TRELLIS_EVENT_POLL", not REDIS_URL)
TRELLIS_EVENT_POLL_INTERVAL = env_int("TRELLIS_EVENT_POLL_MS", 150, minimum=10) / 1000
# ... unless woken: a process that commits events sends each web process's relay a datagram
# (Unix sockets in VAR_DIR/relay/, so processes on one machine), and the relay reads at once;
# its poll then only covers what cannot reach it, every TRELLIS_EVENT_NOTIFY_POLL_MS.
TRELLIS_EVENT_NOTIFY = env_bool("TRELLIS_EVENT_NOTIFY", True)
TRELLIS_EVENT_NOTIFY_POLL_INTERVAL = env_int("TRELLIS_EVENT_NOTIFY_POLL_MS", 1000, minimum=10) / 1000

# --- worker (django-q2) ----------------------------------------------------
Q_TIMEOUT = env_int("TRELLIS_TASK_TIMEOUT", 3600, minimum=1)
# Turns one worker process runs at once, each on a thread of its own (collab/runtime/slots.py,
# docs/capacity.md): a turn waiting on its model holds a slot and nothing else. Worker processes
# stay few (TRELLIS_WORKERS, about one per core); this is what sets how many agents think at once.
TRELLIS_TURNS_PER_WORKER = env_int("TRELLIS_TURNS_PER_WORKER", 128, minimum=1)
# Without a connection pool (SQLite; PostgreSQL with DB_POOL_MAX_SIZE=0) a worker keeps its
# connections between tasks for up to this many seconds (checked before reuse,
# CONN_HEALTH_CHECKS) instead of DB_CONN_MAX_AGE's: a new PostgreSQL connection costs 5–14 ms.
# 0 = as DB_CONN_MAX_AGE. With the pool (PostgreSQL's default) the pool keeps them.
TRELLIS_WORKER_CONN_MAX_AGE = env_int("TRELLIS_WORKER_CONN_MAX_AGE", 300, minimum=0)
Q_RETRY = env_int("TRELLIS_TASK_RETRY", Q_TIMEOUT + 600, minimum=1)
if Q_RETRY <= Q_TIMEOUT:
    # django-q2 re-delivers a task after `retry` seconds: if that is not longer than
    # `timeout`, a slow but healthy turn would be handed to a second worker.
    raise ImproperlyConfigured(f"TRELLIS_TASK_RETRY ({Q_RETRY}) must exceed TRELLIS_TASK_TIMEOUT ({Q_TIMEOUT})")
Q_CLUSTER = {
    "name": env_str("TRELLIS_QUEUE_NAME", "trellis"),  # tests/conftest.py gives each test run its own
    "workers": env_int("TRELLIS_WORKERS", 2, minimum=1),
    "timeout": Q_TIMEOUT,
    "retry": Q_RETRY,
    "max_attempts": 1,
    "ack_failures": True,
    # Successful tasks are not saved (-1): the Job row is the record; failures still are.
    "save_limit": env_int("TRELLIS_Q_SAVE_LIMIT", -1, minimum=-1),
    "catch_up": False,
    "poll": env_int("TRELLIS_Q_POLL_MS", 100, minimum=10) / 1000,
    "label": "Worker queue",
    # A task hands its turn to a slot thread and returns (collab/runtime/slots.py), so a worker
    # counts a task per turn *started*; recycling waits for the turns it holds to end, with that
    # process's slots taken off the cluster meanwhile. Recycle rarely: every 10,000 turns.
    "recycle": env_int("TRELLIS_Q_RECYCLE", 10_000, minimum=1),
    # `Q_CLUSTER_NAME=other manage.py qcluster` (django-q2) serves the broker list `other` with the
    # same signing salt; django-q2 then requires this key (tests and bench/recovery.py use it)
    "ALT_CLUSTERS": {},
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
    # django-q2's Redis broker over one client per process: its own opens a connection per enqueue
    if "brokers" not in TRELLIS_STOCK:
        Q_CLUSTER["broker_class"] = "collab.brokers.SharedRedis"
else:
    Q_CLUSTER["orm"] = "default"

# --- Trellis ---------------------------------------------------------------
TRELLIS_MAX_TOOL_CALLS = env_int("TRELLIS_MAX_TOOL_CALLS", 50, minimum=1)
# Liveness (docs/contract.md#crash-recovery): each worker process renews the leases of the jobs it runs every
# lease/3 s and reconciles every TRELLIS_RECONCILE_SECONDS, so a dead worker's running job is
# interrupted, and the queued jobs it had taken handed off again, within lease + reconcile
# interval of its death (30 + 10 = 40 s by default; at most 2 x lease, checked here).
TRELLIS_LEASE_SECONDS = env_int("TRELLIS_LEASE_SECONDS", 30, minimum=2)
TRELLIS_RECONCILE_SECONDS = env_int("TRELLIS_RECONCILE_SECONDS", max(1, TRELLIS_LEASE_SECONDS // 3), minimum=1)
if TRELLIS_RECONCILE_SECONDS > TRELLIS_LEASE_SECONDS:
    raise ImproperlyConfigured(
        f"TRELLIS_RECONCILE_SECONDS ({TRELLIS_RECONCILE_SECONDS}) must not exceed TRELLIS_LEASE_SECONDS "
        f"({TRELLIS_LEASE_SECONDS}): recovery takes up to lease + reconcile interval"
    )
# A new database's turn tables are ANALYZEd by the reconciler once they hold this much (KB),
# instead of at autovacuum's first pass: the plans prepared on their first rows are made again
# with real proportions (collab/services/statistics.py).
TRELLIS_FIRST_ANALYZE_KB = env_int("TRELLIS_FIRST_ANALYZE_KB", 64, minimum=0)
# Fault points (collab/faults.py) for the reliability suite only: a directory of arming files;
# unset (always, in a deployment) every point is a no-op.
TRELLIS_FAULT_DIR = env_str("TRELLIS_FAULT_DIR", "")

# --- the tool gateway and the explorers' sandbox ---------------------------------------
# Blocking tool-gateway calls (job_output with block, wait_agent, bash, a foreground agent)
# one user may have in flight in one web process; past it 429 too_many_blocking_calls.
TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER = env_int("TRELLIS_GATEWAY_MAX_BLOCKING_PER_USER", 4, minimum=1)
# Long-lived connections — ``?wait=`` requests, SSE streams, foreground gateway calls, MCP streams,
# WebSockets — one user may hold open per web process, and all users together
# (collab.realtime.bounds). TRELLIS_MAX_OPEN_WAITS_PER_USER is the per-user setting's older name.
TRELLIS_MAX_OPEN_STREAMS_PER_USER = env_int(
    "TRELLIS_MAX_OPEN_STREAMS_PER_USER", env_int("TRELLIS_MAX_OPEN_WAITS_PER_USER", 32, minimum=1), minimum=1)
TRELLIS_MAX_OPEN_STREAMS = env_int("TRELLIS_MAX_OPEN_STREAMS", 2048, minimum=1)
# Projects one person may own (staff are exempt; 0 = no limit): every project brings its own
# running cap and quotas, so without it one account could claim any share of the workers.
TRELLIS_MAX_PROJECTS_PER_USER = env_int("TRELLIS_MAX_PROJECTS_PER_USER", 20, minimum=0)
# How long a foreground ``agent`` call through the gateway or MCP waits for its child (which runs on a
# worker) before answering with the execution's id instead (docs/capacity.md).
TRELLIS_GATEWAY_FOREGROUND_WAIT_SECONDS = env_int("TRELLIS_GATEWAY_FOREGROUND_WAIT_SECONDS", 3600, minimum=1)
# Threads per web process that run gateway calls (each off the shared sync-view thread).
TRELLIS_GATEWAY_THREADS = env_int("TRELLIS_GATEWAY_THREADS", 32, minimum=1)
# A pids cgroup directory the workers may create children in (e.g. a delegated cgroup v2
# directory); without it the cgroup v1 pids hierarchy is tried, then RLIMIT_NPROC (non-root only).
TRELLIS_SANDBOX_CGROUP = env_str("TRELLIS_SANDBOX_CGROUP", "")
# What one sandboxed command may write in all (its /tmp and /dev/shm, memory-backed), and its
# memory where the cgroup has the memory controller, in MiB.
TRELLIS_SANDBOX_MEMORY_MB = env_int("TRELLIS_SANDBOX_MEMORY_MB", 512, minimum=16)

# --- fair share (docs/capacity.md#fair-share): the operator's ceilings on every project's limits
# Unset or 0 = no ceiling. A project cannot set a limit above its ceiling (nor 0/"unlimited"
# under a finite one); the value in force is min(project, ceiling), so rows set before a
# ceiling was lowered are capped too. The runtime ceiling defaults to 90 % of
# TRELLIS_TASK_TIMEOUT and may not exceed it (the turn loop enforces it on its slot thread).
def _ceiling(name: str, default: int = 0) -> int | None:
    return env_int(name, default, minimum=0) or None


TRELLIS_LIMIT_CEILINGS = {
    "max_spawn_depth": _ceiling("TRELLIS_MAX_SPAWN_DEPTH"),
    "max_messages": _ceiling("TRELLIS_MAX_MESSAGES"),
    "max_spawn_fanout": _ceiling("TRELLIS_MAX_SPAWN_FANOUT"),
    "max_live_per_session": _ceiling("TRELLIS_MAX_LIVE_PER_SESSION"),
    "max_queued_per_session": _ceiling("TRELLIS_MAX_QUEUED_PER_SESSION"),
    "max_jobs_per_session": _ceiling("TRELLIS_MAX_JOBS_PER_SESSION"),
    "max_tokens_per_job": _ceiling("TRELLIS_MAX_TOKENS_PER_JOB"),
    "max_cost_per_job": env_decimal("TRELLIS_MAX_COST_PER_JOB") or None,
    "max_runtime_seconds": env_int("TRELLIS_MAX_RUNTIME_SECONDS", max(1, Q_TIMEOUT - Q_TIMEOUT // 10), minimum=1),
    "max_idle_seconds": _ceiling("TRELLIS_MAX_IDLE_SECONDS"),
    "max_active_turns": _ceiling("TRELLIS_MAX_ACTIVE_TURNS"),
    # jobs of one project running in worker slots at once (inline children run in their
    # caller's slot); a project may lower it. Default: every turn slot of one cluster — a project
    # alone may use the whole capacity; fair share divides it only when projects compete.
    "max_running_jobs": env_int("TRELLIS_MAX_RUNNING_PER_PROJECT",
                                Q_CLUSTER["workers"] * TRELLIS_TURNS_PER_WORKER, minimum=1),
}
if TRELLIS_LIMIT_CEILINGS["max_runtime_seconds"] > Q_TIMEOUT:
    raise ImproperlyConfigured("TRELLIS_MAX_RUNTIME_SECONDS must not exceed TRELLIS_TASK_TIMEOUT")

# --- model providers (openai, anthropic) -------------------------------------------
# Per request: seconds to wait (while streaming: between chunks); bounded retries on
# 429 / 5xx / connection errors with exponential backoff from the base delay.
TRELLIS_MODEL_TIMEOUT = env_int("TRELLIS_MODEL_TIMEOUT", 120, minimum=1)
TRELLIS_MODEL_RETRIES = env_int("TRELLIS_MODEL_RETRIES", 3, minimum=0)
TRELLIS_MODEL_RETRY_BASE_MS = env_int("TRELLIS_MODEL_RETRY_BASE_MS", 1000, minimum=0)
TRELLIS_MODEL_MAX_TOKENS = env_int("TRELLIS_MODEL_MAX_TOKENS", 4096, minimum=1)  # Anthropic requires one


def _model_prices() -> dict:
    """The operator's model prices: ``TRELLIS_MODEL_PRICES``, a JSON object
    ``{"model": [input $/Mtok, output $/Mtok]}`` added to (and overriding) the built-in table
    of their user, ``collab.runtime.providers.remote.BUILTIN_PRICES``. A bad value stops the process."""
    prices = {}
    raw = env_str("TRELLIS_MODEL_PRICES")
    if raw:
        try:
            extra = json.loads(raw)
            if not isinstance(extra, dict):
                raise ValueError("not an object")
            for model, pair in extra.items():
                if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                        or not all(isinstance(p, (int, float)) and not isinstance(p, bool) and p >= 0 for p in pair)):
                    raise ValueError(f"{model!r} must map to [input, output] non-negative numbers")
                prices[model] = (float(pair[0]), float(pair[1]))
        except ValueError as exc:
            raise ImproperlyConfigured(f'TRELLIS_MODEL_PRICES must be a JSON object like {{"model": [in, out]}} ($ per million tokens): {exc}') from None
    return prices


TRELLIS_MODEL_PRICES = _model_prices()
# Operator-owned model connections (collab.ModelConnection): besides those staff define in
# the admin, a JSON list mirrored into the table on use (collab/conf/model_connections.py).
# Give every process (web and workers) the same value.
TRELLIS_MODEL_CONNECTIONS = model_connections_from_env("TRELLIS_MODEL_CONNECTIONS")

# --- project webhooks ---------------------------------------------------------------------
# The hosts a project's webhook URL may name (collab/conf/webhook_hosts.py; empty = none). Give web
# and workers the same value: the workers check it again before every attempt.
TRELLIS_WEBHOOK_HOSTS = webhook_hosts_from_env("TRELLIS_WEBHOOK_HOSTS")
TRELLIS_WEBHOOK_TIMEOUT = env_int("TRELLIS_WEBHOOK_TIMEOUT", 10, minimum=1)  # per socket operation; 2x per attempt
# People in the loop (docs/contract.md#people-in-the-loop): an email to whoever may decide a new
# ask, through Django's email backend (the console's unless EMAIL_BACKEND/EMAIL_HOST are set);
# links point at TRELLIS_PUBLIC_URL.
TRELLIS_EMAIL_NOTIFICATIONS = env_bool("TRELLIS_EMAIL_NOTIFICATIONS", False)
TRELLIS_PUBLIC_URL = env_str("TRELLIS_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend"
                        if not env_str("EMAIL_HOST", "") else "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "trellis@localhost")

TRELLIS_WEBHOOK_MAX_ATTEMPTS = env_int("TRELLIS_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
# the first retry's delay; each next one doubles, at most an hour (retries go out on the reconcile timer)
TRELLIS_WEBHOOK_RETRY_BASE_SECONDS = env_int("TRELLIS_WEBHOOK_RETRY_BASE_SECONDS", 30, minimum=1)
if TRELLIS_WEBHOOK_MAX_ATTEMPTS > 50:
    raise ImproperlyConfigured(f"TRELLIS_WEBHOOK_MAX_ATTEMPTS must be at most 50, got {TRELLIS_WEBHOOK_MAX_ATTEMPTS}")

# --- traces -----------------------------------------------------------------------------------
# OpenTelemetry traces of the agents' turns (docs/operations.md#traces): on when
# OTEL_EXPORTER_OTLP_ENDPOINT is set (collab/conf/otel.py); the exporter reads the other OTEL_* variables
TRELLIS_TRACING = traces_from_env()

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("TRELLIS_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        # the MCP SDK's per-request lines at /mcp ("Processing request of type …", "Terminating
        # session: None" for every stateless request); its session manager's start stays at INFO
        "mcp.server.lowlevel.server": {"level": "WARNING"},
        "mcp.server.streamable_http": {"level": "WARNING"},
        # django-axes' four lines per sign-in ("Successful login by …", "Cleaned up …"); a
        # lock-out and a failed attempt are its warnings, still shown
        "axes": {"level": "WARNING"},
        # the worker's per-task lines ("processing …", "Processed …"); `manage.py serve` sets WARNING
        "django-q": {"level": env_str("TRELLIS_WORKER_LOG_LEVEL", "INFO")},
    },
}

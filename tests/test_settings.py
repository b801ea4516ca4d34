"""Settings fail loudly on bad values and need nothing for the embedded default (docs/contract.md#deployments)."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CLEAN = {k: v for k, v in os.environ.items()
         if not k.startswith(("DJANGO_", "TRELLIS_", "DATABASE_URL", "REDIS_URL", "DB_"))}
PG = {"DATABASE_URL": "postgres://u:p@db.example:5432/trellis", "DJANGO_SECRET_KEY": "s3cret"}


def load_settings(tmp_path, **env):
    """Import config.settings in a fresh interpreter with exactly ``env`` on top of a clean environment."""
    code = "import config.settings as s; print(s.DATABASES['default']['ENGINE'], s.Q_CLUSTER.get('orm', 'redis'), s.CHANNEL_LAYERS['default']['BACKEND'])"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), **env},
    )


def test_the_embedded_default_needs_no_environment(tmp_path):
    r = load_settings(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["django.db.backends.sqlite3", "default", "channels.layers.InMemoryChannelLayer"]


def test_database_and_redis_urls_switch_to_the_scaled_deployment(tmp_path):
    r = load_settings(tmp_path, DATABASE_URL="postgres://u:p@db.example:5432/trellis", REDIS_URL="redis://cache:6379/0",
                      DJANGO_SECRET_KEY="s3cret")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["django.db.backends.postgresql", "redis", "collab.infra.channel_layer.RedisChannelLayer"]


def test_the_redis_channel_layer_reads_longer_than_its_blocking_receive(tmp_path):
    """channels-redis blocks ``brpop_timeout`` (5 s) in BZPOPMIN while a channel is idle; redis-py 8
    reads with a 5 s timeout unless told otherwise, and the timeout then raised into the consumer
    receiving (bench/live.py: consumers died with "Timeout reading from 127.0.0.1:6379")."""
    from channels_redis.core import RedisChannelLayer

    code = "import config.settings as s; print(s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0]['socket_timeout'])"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), "REDIS_URL": "redis://cache:6379/0",
                            "DATABASE_URL": "postgres://u:p@db.example:5432/trellis", "DJANGO_SECRET_KEY": "s3cret"})
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) > RedisChannelLayer.brpop_timeout


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG"),
        ({"TRELLIS_WORKERS": "two"}, "TRELLIS_WORKERS"),
        ({"TRELLIS_TASK_TIMEOUT": "600", "TRELLIS_TASK_RETRY": "600"}, "must exceed TRELLIS_TASK_TIMEOUT"),
        ({"DJANGO_ALLOWED_HOSTS": "*"}, "only allowed with DJANGO_DEBUG=1"),
        ({"DATABASE_URL": "postgres://u@h/db"}, "DJANGO_SECRET_KEY must be set"),
        ({"DATABASE_URL": "mysql://u@h/db", "DJANGO_SECRET_KEY": "x"}, "unsupported database engine"),
        ({"TRELLIS_WEBHOOK_HOSTS": "https://hooks.example.com"}, "TRELLIS_WEBHOOK_HOSTS entry"),
        ({"TRELLIS_WEBHOOK_HOSTS": "ci.example.com,*.example.com"}, "wildcards are not supported"),
        ({"TRELLIS_WEBHOOK_HOSTS": "ci.example.com:0"}, "the port must be 1-65535 or *"),
        ({"TRELLIS_WEBHOOK_HOSTS": "fd00::7"}, "IPv6 address in brackets"),
        ({"DB_POOL_MAX_SIZE": "4"}, "DB_POOL_MAX_SIZE needs a PostgreSQL DATABASE_URL"),
        ({**PG, "DB_POOL_MAX_SIZE": "four"}, "DB_POOL_MAX_SIZE must be an integer"),
        ({**PG, "DB_POOL_MAX_SIZE": "4", "DB_CONN_MAX_AGE": "60"}, "exclude each other"),
        ({**PG, "DB_POOL_MAX_SIZE": "4", "DB_POOL_MIN_SIZE": "5"}, "must not exceed DB_POOL_MAX_SIZE"),
        ({**PG, "DB_POOL_MAX_SIZE": "4", "DB_POOL_TIMEOUT": "0"}, "DB_POOL_TIMEOUT must be >= 1"),
    ],
)
def test_bad_settings_stop_the_process_with_a_message_naming_the_problem(tmp_path, env, message):
    r = load_settings(tmp_path, **env)
    assert r.returncode != 0
    assert "ImproperlyConfigured" in r.stderr and message in r.stderr, r.stderr


def test_cookies_are_secure_unless_debugging_or_serving_loopback_only(tmp_path):
    code = "import config.settings as s; print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SESSION_COOKIE_HTTPONLY)"

    def flags(**env):
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), **env})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert flags() == ["False", "False", "True"]  # the embedded default on 127.0.0.1
    assert flags(DJANGO_ALLOWED_HOSTS="trellis.example.com") == ["True", "True", "True"]
    assert flags(DJANGO_ALLOWED_HOSTS="trellis.example.com", DJANGO_DEBUG="1") == ["False", "False", "True"]


def _pool(tmp_path, **env):
    code = "import config.settings as s; print(s.DATABASES['default']['OPTIONS'].get('pool'))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_postgresql_has_a_connection_pool_by_default_and_the_operator_may_size_or_drop_it(tmp_path):
    """On PostgreSQL psycopg's pool is on by default (8 connections per process); DB_POOL_MAX_SIZE
    sizes it and 0 turns it off, as does DB_CONN_MAX_AGE (persistent connections instead). The
    embedded default (SQLite) has none."""
    assert _pool(tmp_path) == "None"
    assert _pool(tmp_path, **PG) == "{'min_size': 2, 'max_size': 8, 'timeout': 10}"
    assert _pool(tmp_path, **PG, DB_POOL_MAX_SIZE="0") == "None"
    assert _pool(tmp_path, **PG, DB_CONN_MAX_AGE="60") == "None"
    assert _pool(tmp_path, **PG, DB_POOL_MAX_SIZE="8") == "{'min_size': 2, 'max_size': 8, 'timeout': 10}"
    assert (_pool(tmp_path, **PG, DB_POOL_MAX_SIZE="3", DB_POOL_MIN_SIZE="0", DB_POOL_TIMEOUT="5")
            == "{'min_size': 0, 'max_size': 3, 'timeout': 5}")


def test_a_qcluster_opens_no_pool_before_it_forks_and_each_worker_opens_its_own(tmp_path):
    """django-q2 forks its workers from the ``qcluster`` process: the pool is set aside there
    before any connection exists (a pool's connections and threads do not survive a fork), and a
    worker process, once forked (django-q2's ``post_spawn`` calls ``_pool_in_worker``), gets it
    back as its own."""
    code = ("import sys; sys.argv = ['manage.py', sys.argv[1]]; import django; django.setup(); "
            "from django.db import connections; print(connections['default'].settings_dict['OPTIONS'].get('pool')); "
            "from collab.apps import _pool_in_worker; _pool_in_worker(sender='django_q'); "
            "print(connections['default'].settings_dict['OPTIONS'].get('pool'))")
    outputs = []
    for command in ("qcluster", "runserver"):
        r = subprocess.run([sys.executable, "-c", code, command], cwd=ROOT, capture_output=True, text=True,
                           env={**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings",
                                **PG, "DB_POOL_MAX_SIZE": "4"})
        assert r.returncode == 0, r.stderr
        outputs.append(r.stdout.strip().splitlines())
    pool = "{'min_size': 2, 'max_size': 4, 'timeout': 10}"
    assert outputs == [["None", pool], [pool, pool]]


def test_a_setting_the_middleware_cannot_honour_stops_every_process_at_start_up(tmp_path):
    """``CSRF_USE_SESSIONS`` would make the CSRF check, which runs on the event loop, read the
    session from the database there: an operator's settings module that sets it stops
    ``manage.py`` (and so daphne and the workers) with a message, before any request."""
    (tmp_path / "operator_settings.py").write_text("from config.settings import *  # noqa\nCSRF_USE_SESSIONS = True\n")
    env = {**CLEAN, "TRELLIS_VAR_DIR": str(tmp_path), "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "DJANGO_SETTINGS_MODULE": "operator_settings"}
    r = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT, capture_output=True,
                       text=True, env=env)
    assert r.returncode != 0
    assert "ImproperlyConfigured" in r.stderr and "CSRF_USE_SESSIONS = True is not supported" in r.stderr, r.stderr
    (tmp_path / "operator_settings.py").write_text("from config.settings import *  # noqa\n")
    assert subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT, capture_output=True,
                          text=True, env=env).returncode == 0

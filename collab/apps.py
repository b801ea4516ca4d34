import logging

from django.apps import AppConfig
from django.conf import settings
from django.db import close_old_connections, connections
from django.db.models.signals import post_delete, post_save

from collab import task_queue, worker_name
from collab.infra import tracing
from collab.realtime.push import warm_push


class CollabConfig(AppConfig):
    name = "collab"
    verbose_name = "Collaboration"

    def ready(self):
        # app registry: django_q.signals imports django_q's models, not loaded when this module is
        from django_q.signals import post_spawn

        from collab.middleware import refuse_unsupported_settings  # it imports django.contrib.auth's models

        refuse_unsupported_settings()

        # app registry: the user model and collab's services need the models loaded
        from django.contrib.auth import get_user_model

        from collab.services.members import user_deleted, user_saved
        from collab.services.specs import use_toolset_names
        from collab.tools.registry import toolset_names

        use_toolset_names(toolset_names)

        post_save.connect(user_saved, sender=get_user_model(), dispatch_uid="collab-user-saved")
        post_delete.connect(user_deleted, sender=get_user_model(), dispatch_uid="collab-user-deleted")

        post_spawn.connect(_unlocked_task_queue, dispatch_uid="collab-unlocked-task-queue")
        post_spawn.connect(_pool_in_worker, dispatch_uid="collab-pool-in-worker")
        post_spawn.connect(_keep_worker_connections, dispatch_uid="collab-keep-worker-connections")
        post_spawn.connect(_reconcile_on_worker_start, dispatch_uid="collab-reconcile-on-spawn")
        post_spawn.connect(_warm_event_push, dispatch_uid="collab-warm-event-push")
        post_spawn.connect(_tracing_in_worker, dispatch_uid="collab-tracing-in-worker")

        if worker_name.is_worker_process():
            worker_name.install()
            _no_pool_in_workers()


_worker_pools: dict[str, dict] = {}


def _no_pool_in_workers() -> None:
    """A ``qcluster``'s own processes (its main process, sentinel, pusher and monitor) use no
    connection pool: django-q2 forks its workers from them, and a pool's connections and threads
    do not survive a fork. The pool's options are kept aside for the workers, each of which opens
    a pool of its own once forked (``_pool_in_worker``). Before any connection or pool exists, so
    nothing is inherited."""
    for alias in connections:
        pool = connections[alias].settings_dict.get("OPTIONS", {}).pop("pool", None)
        if pool:
            _worker_pools[alias] = pool


def _unlocked_task_queue(sender, **kwargs):
    """A worker waits for its next task without holding the task queue's lock, so its death
    cannot wedge the cluster (``collab.task_queue``)."""
    task_queue.install()


def _pool_in_worker(sender, **kwargs):
    """In a worker process, just forked (django-q2's ``post_spawn``): the connection pool again
    (``DB_POOL_MAX_SIZE``, PostgreSQL's default), this process's own. Its many turns
    (``TRELLIS_TURNS_PER_WORKER``) share it, each holding a connection only while it queries."""
    for alias, pool in _worker_pools.items():  # django-q2 closed every connection before it forked
        connections[alias].settings_dict.setdefault("OPTIONS", {})["pool"] = pool


def _keep_worker_connections(sender, **kwargs):
    """Without a pool, a worker process keeps its database connections between tasks
    (``TRELLIS_WORKER_CONN_MAX_AGE``), health-checked before each task reuses one (django-q2 calls
    ``close_old_connections`` before each task): a turn no longer opens a connection of its own.
    A web process keeps ``DB_CONN_MAX_AGE``; a pooled process leaves connections to the pool."""
    age = settings.TRELLIS_WORKER_CONN_MAX_AGE
    if not age:
        return
    for alias in connections:
        conn = connections[alias]
        if conn.settings_dict.get("OPTIONS", {}).get("pool"):
            continue
        if conn.settings_dict.get("CONN_MAX_AGE") is not None and conn.settings_dict["CONN_MAX_AGE"] < age:
            conn.settings_dict["CONN_MAX_AGE"] = age
            conn.settings_dict["CONN_HEALTH_CHECKS"] = True


def _warm_event_push(sender, **kwargs):
    """A worker's first event reaches its listeners without waiting for the push loop and its
    channel-layer connection to be set up (``collab.realtime.push.warm_push``, in the background)."""

    try:
        warm_push()
    except Exception:  # never keep a worker from starting
        logging.getLogger(__name__).exception("warming the event push at worker start failed")


def _tracing_in_worker(sender, **kwargs):
    """A worker that exports traces builds its tracer provider as it starts, not in its first turn
    (``collab.infra.tracing``; nothing while tracing is off)."""
    try:
        tracing.start()
    except Exception:  # never keep a worker from starting: its turns then run untraced
        logging.getLogger(__name__).exception("setting up traces at worker start failed")


def _reconcile_on_worker_start(sender, proc_name=None, **kwargs):
    """At worker start, jobs left running by a dead process become interrupted (docs/contract.md#crash-recovery); from
    then on the process renews its jobs' leases and reconciles on a timer (services/liveness.py)."""
    # app registry: the services import collab's models, not loaded when this module is
    from collab.services.liveness import start_reconciler
    from collab.services.reconcile import reconcile

    try:
        reconcile()
    except Exception:  # never keep a worker from starting
        logging.getLogger(__name__).exception("reconcile at worker start failed")
    finally:
        close_old_connections()
    start_reconciler()

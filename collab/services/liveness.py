"""Liveness is the worker's, not the loop's (SPEC §7 P-REL-1, OW §8).

Every process that runs jobs keeps a registry of the jobs it is running (inline
foreground children too) and one *heartbeat* thread that, every
``TRELLIS_LEASE_SECONDS / 3``, renews all their leases in one conditional UPDATE
on the database clock — whatever the turns are blocked on (a model call,
``job_output``, ``bash``, an inline child). A process that dies stops renewing:
its jobs' leases run out and reconcile recovers them.

Worker processes also run a *reconciler* thread that calls
:func:`collab.services.reconcile.reconcile` every ``TRELLIS_RECONCILE_SECONDS``
(with a little jitter), so recovery never waits for a free worker slot. Each
step of a reconcile is a conditional, idempotent update, so several processes
reconciling at once act on each job at most once; when nothing is wrong a pass
costs three indexed reads. A dead worker's running job is therefore interrupted,
and the queued jobs it had taken re-enqueued, within
``TRELLIS_LEASE_SECONDS + TRELLIS_RECONCILE_SECONDS`` of its death (see README).

Both threads are daemons, one per process (started again after a fork), and
close their database connection after every pass, so a process that exits
while they sleep leaves no connection behind.
"""

import logging
import os
import random
import threading
import time
from contextlib import contextmanager

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models.functions import Now

from collab.models import Job
from collab.services.execution import lease_deadline
from collab.services.reconcile import reconcile

log = logging.getLogger(__name__)

_lock = threading.Lock()
_jobs: set[str] = set()
_threads: dict[str, tuple[int, threading.Thread]] = {}


def running_job_ids() -> list[str]:
    with _lock:
        return sorted(_jobs)


@contextmanager
def running(job_id: str):
    """Register a job this process has claimed for as long as it runs here; its lease is
    renewed by the heartbeat thread meanwhile, and no longer once it leaves."""
    start_heartbeat()
    with _lock:
        _jobs.add(job_id)
    try:
        yield
    finally:
        with _lock:
            _jobs.discard(job_id)


def renew_leases(job_ids) -> int:
    """One conditional UPDATE: the leases of those jobs that are still running or stopping
    move to the database's now + lease. Returns how many rows it renewed."""
    if not job_ids:
        return 0
    return Job.objects.running().filter(pk__in=list(job_ids)).update(
        heartbeat_at=Now(), lease_expires_at=lease_deadline()
    )


def start_heartbeat() -> None:
    _start("heartbeat", _heartbeat_loop)


def start_reconciler() -> None:
    """Worker processes only (started at spawn): reconcile on a timer, slot or no slot."""
    start_heartbeat()
    _start("reconciler", _reconciler_loop)


def _start(name: str, target) -> None:
    pid = os.getpid()
    with _lock:
        owner, thread = _threads.get(name, (None, None))
        if owner == pid and thread.is_alive():
            return
        if owner is not None and owner != pid:  # a forked child inherits its parent's registry, not its threads
            _jobs.clear()
        thread = threading.Thread(target=target, name=f"trellis-{name}", daemon=True)
        _threads[name] = (pid, thread)
        thread.start()


def _heartbeat_loop() -> None:
    beat = settings.TRELLIS_LEASE_SECONDS / 3
    while True:
        started = time.monotonic()
        ids = running_job_ids()
        if ids:
            _pass("lease renewal", lambda ids=ids: renew_leases(ids))
        time.sleep(max(0.0, beat - (time.monotonic() - started)))


def _reconciler_loop() -> None:
    interval = settings.TRELLIS_RECONCILE_SECONDS
    time.sleep(random.uniform(0, interval))  # processes started together do not reconcile in step
    while True:
        started = time.monotonic()
        _pass("reconcile", reconcile)
        time.sleep(max(0.0, interval * random.uniform(0.9, 1.0) - (time.monotonic() - started)))


def _pass(what: str, fn) -> None:
    """One pass on this thread's own connection, closed afterwards whatever happened."""
    try:
        close_old_connections()
        fn()
    except Exception:  # the thread must outlive a database hiccup; the next pass tries again
        log.exception("%s failed", what)
    finally:
        connection.close()

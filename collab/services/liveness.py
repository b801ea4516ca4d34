"""Liveness is the worker's, not the loop's (docs/contract.md#crash-recovery).

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
``TRELLIS_LEASE_SECONDS + TRELLIS_RECONCILE_SECONDS`` of its death (docs/operations.md, "Running scaled").

A third thread, the *stop watch*, reads every ``STOP_CHECK_SECONDS`` which of the
process's jobs were asked to stop, in one query for all of them, and signals each such turn
(its ``StopSignal``): a turn checks a flag instead of the database, a sleeping turn wakes at
once, and a model call in flight is aborted (its HTTP request closed). However many turns a
process holds (``collab.runtime.slots``), it costs one heartbeat and one stop query per beat.

All three threads are daemons, one per process (started again after a fork), and
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

from collab.models import Job, JobStatus
from collab.services.execution import lease_deadline
from collab.services.reconcile import reconcile
from collab.services.waiting import idle_connection

log = logging.getLogger(__name__)

STOP_CHECK_SECONDS = 0.2

_lock = threading.Lock()
_jobs: dict[str, "StopSignal"] = {}
_threads: dict[str, tuple[int, threading.Thread]] = {}


class StopSignal:
    """A running job's stop request as this process knows it: set by the stop watch once the
    job's status is no longer ``running`` (``status`` says what it became). Whoever waits on
    something that can be abandoned (a model call's HTTP request) registers how to abandon it
    with ``aborting``; it is called, from the stop watch's thread, when the stop comes."""

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._aborts: list = []
        self.status: str | None = None
        self.unseen = False  # the stop watch did not find the job's row: the turn asks itself

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    def set(self, status: str) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self.status = status
            self._event.set()
            aborts, self._aborts = self._aborts, []
        for abort in aborts:
            try:
                abort()
            except Exception:  # an abort is best effort: the turn still sees the flag
                log.debug("aborting a stopped job's call failed", exc_info=True)

    @contextmanager
    def aborting(self, abort):
        """While the block runs, a stop calls ``abort()`` (at once if the stop came already)."""
        with self._lock:
            stopped = self._event.is_set()
            if not stopped:
                self._aborts.append(abort)
        if stopped:
            abort()
        try:
            yield
        finally:
            with self._lock:
                if abort in self._aborts:
                    self._aborts.remove(abort)


def running_job_ids() -> list[str]:
    with _lock:
        return sorted(_jobs)


def stop_signal(job_id: str) -> "StopSignal | None":
    """The stop signal of a job running in this process, or None."""
    with _lock:
        return _jobs.get(job_id)


@contextmanager
def running(job_id: str):
    """Register a job this process has claimed for as long as it runs here; its lease is
    renewed by the heartbeat thread meanwhile, and no longer once it leaves. Yields the job's
    ``StopSignal``, set by the stop watch once the job is asked to stop."""
    start_heartbeat()
    signal = StopSignal()
    with _lock:
        _jobs[job_id] = signal
    try:
        yield signal
    finally:
        with _lock:
            if _jobs.get(job_id) is signal:
                del _jobs[job_id]


def renew_leases(job_ids) -> int:
    """One conditional UPDATE: the leases of those jobs that are still running or stopping
    move to the database's now + lease. Returns how many rows it renewed."""
    if not job_ids:
        return 0
    return Job.objects.running().filter(pk__in=list(job_ids)).update(
        heartbeat_at=Now(), lease_expires_at=lease_deadline()
    )


def watch_stops(job_ids) -> int:
    """One query: which of these jobs are no longer ``running``; signal each. Returns how many."""
    if not job_ids:
        return 0
    ids = list(job_ids)
    statuses = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    stopped = 0
    for job_id in ids:
        signal = stop_signal(job_id)
        if signal is None:
            continue
        if job_id not in statuses:
            # gone (its session deleted), or not visible to this thread's connection (a turn run
            # inside a transaction): the turn asks its own connection at its next check
            signal.unseen = True
        elif statuses[job_id] != JobStatus.RUNNING:
            signal.set(statuses[job_id])
            stopped += 1
    return stopped


def start_heartbeat() -> None:
    """The lease renewal and the stop watch of this process's running jobs."""
    _start("heartbeat", _heartbeat_loop)
    _start("stop-watch", _stop_watch_loop)


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


def _stop_watch_loop() -> None:
    while True:
        started = time.monotonic()
        ids = [job_id for job_id, signal in _snapshot() if not signal.is_set()]
        if ids:
            _pass("stop watch", lambda ids=ids: watch_stops(ids), keep=True)
        time.sleep(max(0.0, STOP_CHECK_SECONDS - (time.monotonic() - started)))


def _snapshot() -> list:
    with _lock:
        return list(_jobs.items())


def _reconciler_loop() -> None:
    interval = settings.TRELLIS_RECONCILE_SECONDS
    time.sleep(random.uniform(0, interval))  # processes started together do not reconcile in step
    while True:
        started = time.monotonic()
        _pass("reconcile", reconcile)
        time.sleep(max(0.0, interval * random.uniform(0.9, 1.0) - (time.monotonic() - started)))


def _pass(what: str, fn, *, keep: bool = False) -> None:
    """One pass on this thread's own connection, closed afterwards whatever happened
    (``keep``, for the stop watch's frequent passes: given back to the pool, or kept where there
    is none — a connection per pass would cost more than the query)."""
    try:
        close_old_connections()
        fn()
    except Exception:  # the thread must outlive a database hiccup; the next pass tries again
        log.exception("%s failed", what)
        connection.close()
    finally:
        if keep:
            idle_connection()
        else:
            connection.close()

"""The reliability suite's shared parts.

Sizes: each test runs a bounded size in CI and its full size with ``TRELLIS_RELIABILITY_FULL=1``
(``size(ci, full)``). Each test reports its figure (``figure("R1: …")``): printed, and listed
again at the end of the run under "reliability figures" (tests/conftest.py).

Worker machines: ``machines`` starts and kills real ``manage.py qcluster`` process groups
serving a queue of their own (the turns this suite admits go there, never to the session-wide
``worker``), with a short lease (3 s) and reconcile interval (1 s) so a dead machine's jobs are
recovered within seconds, and with ``TRELLIS_FAULT_DIR`` set, so ``faults.arm(name)`` makes the
next process that passes ``collab.faults.fault_point(name)`` die there.
"""

import os
import signal
from pathlib import Path

import pytest

from tests.collab.test_liveness import start_cluster
from tests.conftest import wait_at_rest

FULL = os.environ.get("TRELLIS_RELIABILITY_FULL", "") == "1"
LEASE, RECONCILE = 3, 1
WAIT = 180.0  # a hang guard for loaded machines; never reached when things work


def size(ci: int, full: int) -> int:
    """The bounded size in CI, the full one with TRELLIS_RELIABILITY_FULL=1."""
    return full if FULL else ci


@pytest.fixture
def figure(request):
    """``figure(text)``: the test's figure, printed and kept for the run's summary."""

    def report(text: str) -> None:
        print(text)
        request.node.user_properties.append(("reliability_figure", text))

    return report


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


class Faults:
    """Arming files for ``collab.faults.fault_point`` in the machines' ``TRELLIS_FAULT_DIR``."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._n = 0

    def arm(self, name: str) -> None:
        self._n += 1
        (self.directory / f"{name}#{self._n:04d}").touch()

    def armed(self, name: str) -> int:
        return sum(1 for p in self.directory.iterdir() if p.name == name or p.name.startswith(name + "#"))

    def fired(self, name: str) -> list[int]:
        """The pids of the processes that died at ``name``, in order."""
        log = self.directory / f"{name}.fired"
        return [int(line) for line in log.read_text().split()] if log.exists() else []

    def disarm(self) -> None:
        for p in self.directory.iterdir():
            if "#" in p.name:
                p.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def _reliability_queue(process_env):
    return process_env["TRELLIS_QUEUE_NAME"] + "-reliability"


@pytest.fixture(scope="session")
def faults(tmp_path_factory):
    return Faults(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="session")
def machine_env(process_env, _reliability_queue, faults):
    return dict(process_env, TRELLIS_LEASE_SECONDS=str(LEASE), TRELLIS_RECONCILE_SECONDS=str(RECONCILE),
                Q_CLUSTER_NAME=_reliability_queue, TRELLIS_FAULT_DIR=str(faults.directory),
                TRELLIS_MAX_RUNNING_PER_PROJECT="16")


class Machines:
    """Worker machines (qcluster process groups) started and killed by a test."""

    def __init__(self, env: dict, logs: Path):
        self.env, self.logs, self.procs, self._n = env, logs, [], 0

    def start(self, workers: int = 2):
        self._n += 1
        proc = start_cluster(self.env, self.logs / f"machine-{self._n}.log", workers=workers)
        self.procs.append(proc)
        return proc

    def alive(self) -> list:
        return [p for p in self.procs if p.poll() is None]

    def owner_of(self, pid: int):
        """The live machine whose process group holds ``pid``, or None."""
        try:
            group = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return next((p for p in self.alive() if p.pid == group), None)

    def kill(self, proc) -> None:
        """The whole machine dies at once (SIGKILL to its process group)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)

    def stop_all(self) -> None:
        """At rest by now (or the test failed): no need to wait for a graceful stop."""
        for proc in self.procs:
            self.kill(proc)

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.log.read_text(errors='replace')[-2000:]}" for p in self.procs)


@pytest.fixture
def machines(transactional_db, machine_env, _reliability_queue, faults, monkeypatch, tmp_path):
    """Worker machines on this suite's queue; the test's turns are enqueued there. Afterwards
    whatever is still open is cancelled and the machines are let go quiet, then stopped."""
    from django_q.brokers import get_broker
    from django_q.conf import Conf

    monkeypatch.setattr(Conf, "CLUSTER_NAME", _reliability_queue)
    fleet = Machines(machine_env, tmp_path)
    try:
        yield fleet
        faults.disarm()
        if not fleet.alive():
            fleet.start()
        # the broker is left out: a task taken by a killed worker stays taken (ORM broker) until
        # its retry time, though its job has long been recovered; it is purged below
        wait_at_rest(60, cancel=True, broker=False)
    finally:
        faults.disarm()
        fleet.stop_all()
        get_broker().purge_queue()


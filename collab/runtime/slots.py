"""Turn slots: one worker process runs many turns at once (docs/capacity.md).

django-q2 still delivers every turn to a worker process as a task. The task no longer runs the
turn itself: it takes one of the process's ``TRELLIS_TURNS_PER_WORKER`` slots, claims the job on
its own thread (the job table's conditional UPDATE, as before: the claim, the lease and
reconcile stay the source of truth) and hands the claimed turn to a slot thread. Then it
returns, and the worker process takes its next task from the broker.

- **Backpressure.** While every slot is in use the task waits for one, so the process takes no
  further task and the broker hands the next to another process. A task that waits
  ``SLOT_WAIT_SECONDS`` puts its job back in the broker untouched (still ``queued``) and
  returns: no task outlives django-q2's timeout waiting for a slot.
- **Crash safety.** A turn in a slot is a claimed job with a lease, renewed by the process's one
  heartbeat (``collab.services.liveness``) like every job it runs; a process that dies stops
  renewing and reconcile recovers each of its jobs once, as it did for one.
- **Threads, not an event loop.** A turn is synchronous code end to end (the ORM, the
  providers' SDKs, the tools); one thread per turn in flight keeps it so. A waiting thread costs
  its stack's resident pages (tens of kB) and, while it waits on a model, a sleep or another
  agent, no database connection: it gives its connection back to the pool first
  (``collab.runtime.loop``, ``collab.services.waiting``).
- **Exit.** The slot threads are joined when the process exits (django-q2's recycling, a
  graceful stop): a worker that stops finishes the turns it holds, as it finished its one turn.
"""

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

SLOT_WAIT_SECONDS = 60.0
# How long after its slots were last all in use a process still counts them as contended: turns
# that end together free their slots together, and the tasks that take those slots within this
# time are still choosing between queued turns (``collab.services.execution.claim_for_slot``).
CONTENDED_SECONDS = 2.0


class TurnSlots:
    """A process's turn slots: at most ``size`` turns in flight, each on a thread of its own.

    ``take`` a slot (waiting at most ``timeout``), then ``start`` a turn in it or ``give_back``
    the slot; a started turn gives its slot back when it ends, however it ends."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError("a process needs at least one turn slot")
        self.size = size
        self._lock = threading.Condition()
        self._taken = 0  # slots taken: turns running plus takes not yet started or given back
        self._running: dict[str, float] = {}  # job id -> when its turn started (monotonic)
        self._started_total = 0
        self._last_full: float | None = None  # when every slot was last seen in use (monotonic)
        self._executor: ThreadPoolExecutor | None = None

    def take(self, timeout: float | None = None) -> bool:
        """Take a free slot; wait up to ``timeout`` seconds for one (None: as long as it takes).
        False if none came free in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._taken >= self.size:
                self._last_full = time.monotonic()
                left = None if deadline is None else deadline - self._last_full
                if left is not None and left <= 0:
                    return False
                self._lock.wait(left)
            self._taken += 1
            if self._taken >= self.size:
                self._last_full = time.monotonic()
            return True

    def contended(self) -> bool:
        """Whether every slot is in use, or was within the last ``CONTENDED_SECONDS``: turns may
        be waiting for a slot, so the one just taken should go to the fairest of them."""
        with self._lock:
            return self._last_full is not None and time.monotonic() - self._last_full < CONTENDED_SECONDS

    def give_back(self) -> None:
        """Free a slot taken and not started."""
        with self._lock:
            if self._taken <= 0:
                raise RuntimeError("no slot is taken")
            self._free_one()

    def _free_one(self) -> None:
        if self._taken >= self.size:  # full until now: the takes that follow are still contended
            self._last_full = time.monotonic()
        self._taken -= 1
        self._lock.notify()

    def start(self, job_id: str, turn: Callable[[], object], *, after: Callable[[], object] | None = None) -> None:
        """Run ``turn()`` on a slot thread in the slot taken for it; ``after()`` runs on that
        thread once the turn has ended (its database connection is closed there)."""
        with self._lock:
            if self._taken <= len(self._running):
                raise RuntimeError("start needs a slot taken for it")
            if job_id in self._running:
                raise RuntimeError(f"job {job_id} already runs in a slot of this process")
            self._running[job_id] = time.monotonic()
            self._started_total += 1
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.size, thread_name_prefix="trellis-turn")
            executor = self._executor
        try:
            executor.submit(self._run, job_id, turn, after)
        except BaseException:
            self._end(job_id)
            raise

    def _run(self, job_id: str, turn, after) -> None:
        try:
            turn()
        finally:
            try:
                if after is not None:
                    after()
            finally:
                self._end(job_id)

    def _end(self, job_id: str) -> None:
        with self._lock:
            self._running.pop(job_id, None)
            self._free_one()

    def in_use(self) -> int:
        with self._lock:
            return self._taken

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def snapshot(self) -> dict:
        """What the health endpoint and the admin show of this process: its slots, those in use,
        the turns running and for how long."""
        now = time.monotonic()
        with self._lock:
            return {
                "size": self.size,
                "in_use": self._taken,
                "free": self.size - self._taken,
                "started": self._started_total,
                "running": {job: round(now - since, 1) for job, since in sorted(self._running.items())},
            }


_process_slots: tuple[int, TurnSlots] | None = None
_process_lock = threading.Lock()


def process_slots() -> TurnSlots:
    """This process's slots, made on first use (in a forked worker: its own, never its parent's)."""
    global _process_slots
    pid = os.getpid()
    with _process_lock:
        if _process_slots is None or _process_slots[0] != pid:
            _process_slots = (pid, TurnSlots(settings.TRELLIS_TURNS_PER_WORKER))
        return _process_slots[1]

"""The deployment's turn capacity as the job table shows it (docs/capacity.md): the turns in
worker slots per worker process (``Job.worker``, ``host:pid``), the turns queued, and those of
them waiting for their project's running cap. Three aggregate queries; for operators only (the
admin's executions page), since the figures span every project."""

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count

from collab.models import Job, JobStatus


@dataclass(frozen=True)
class WorkerLoad:
    worker: str
    in_use: int
    size: int

    @property
    def free(self) -> int:
        return max(0, self.size - self.in_use)


@dataclass(frozen=True)
class Capacity:
    slots_per_worker: int
    workers: list[WorkerLoad]
    running: int
    queued: int
    waiting_for_slot: int


def capacity() -> Capacity:
    """Slots in use per worker process (jobs running in worker slots: a foreground child runs in
    its caller's slot and is not counted), and the queue. A worker process with no turn running
    does not appear: the job table knows processes only by the turns they run."""
    size = settings.TRELLIS_TURNS_PER_WORKER
    rows = (Job.objects.running().filter(run_in_background=True).exclude(worker="")
            .values("worker").annotate(n=Count("pk")).order_by("worker"))
    workers = [WorkerLoad(worker=row["worker"], in_use=row["n"], size=size) for row in rows]
    queued = Job.objects.filter(status=JobStatus.QUEUED)
    return Capacity(
        slots_per_worker=size,
        workers=workers,
        running=sum(w.in_use for w in workers),
        queued=queued.count(),
        waiting_for_slot=queued.filter(waiting_since__isnull=False).count(),
    )

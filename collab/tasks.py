"""django-q2 task entry points: load ids, call the runtime. Nothing else lives here."""

from django.db import close_old_connections


def run_turn(job_id: str) -> str | None:
    from collab.runtime.loop import run_job

    close_old_connections()
    try:
        return run_job(job_id)
    finally:
        close_old_connections()

"""django-q2 task entry points: load ids, call the runtime. Nothing else lives here."""

from django.db import close_old_connections


def run_turn(job_id: str) -> str | None:
    from collab.runtime.loop import run_job

    close_old_connections()
    try:
        return run_job(job_id)
    finally:
        close_old_connections()


def name_branch(branch_id: str) -> None:
    from collab.runtime.naming import auto_name_branch

    close_old_connections()
    try:
        auto_name_branch(branch_id)
    finally:
        close_old_connections()


def reconcile() -> dict:
    from collab.services.reconcile import reconcile as run

    close_old_connections()
    try:
        return run()
    finally:
        close_old_connections()


def deliver_webhook(delivery_id: str) -> str | None:
    from collab.runtime.webhooks import deliver

    close_old_connections()
    try:
        return deliver(delivery_id)
    finally:
        close_old_connections()

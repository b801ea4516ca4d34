"""Row → API shape. One function per shape, shared by the API, pages and tools."""

from django.db.models import Sum

from collab.access import visible_session_ids
from collab.models import Job, Session, format_address


def usage_totals(jobs) -> dict:
    """Token and cost totals of a job queryset (one aggregate query)."""
    totals = jobs.aggregate(tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), cost=Sum("cost"))
    return {"tokens_in": totals["tokens_in"] or 0, "tokens_out": totals["tokens_out"] or 0,
            "cost": str(totals["cost"] or 0)}


def session_usage(session: Session) -> dict:
    """Token and cost totals over all of a session's executions."""
    return usage_totals(session.jobs.all())


def project_usage(project, viewer) -> dict:
    """Token and cost totals over the project's executions in the sessions ``viewer`` may see: a
    private session's spending is not shown to those who may not see the session."""
    return usage_totals(project.jobs.filter(session_id__in=visible_session_ids(viewer)))


def session_shape(session: Session) -> dict:
    return {
        "usage": session_usage(session),
        "id": session.pk,
        "project": session.project.slug,
        "title": session.title,
        "agent_id": session.agent_spec.agent_id if session.agent_spec_id else None,
        "head": session.head_id,
        "parent_session": session.parent_session_id,
        "agent_role": session.agent_role,  # "explorer" for an OpenWork sub-agent's session
        "created_at": session.created_at,
        "last_active_at": session.last_active_at,
        "last_event_seq": session.last_event_seq,
        # who sees it; a sub-agent's session follows its root's
        "visibility": session.parent_session.visibility if session.parent_session_id else session.visibility,
    }


def execution_shape(job: Job) -> dict:
    return {
        "id": job.pk,
        "status": job.status,
        "version": job.version,
        "kind": job.kind,
        "result": job.result,  # the stored result or the final answer (Job.result)
        "is_error": job.is_error,
        "error_code": job.error_code,
        "error_reason": job.error_reason,
        "parent_job": job.parent_job_id,
        "session": job.session_id,
        "branch": job.branch_id,
        "caller_session": job.caller_session_id,
        "prompt_msg": job.prompt_msg_id,
        "tokens_in": job.tokens_in,
        "tokens_out": job.tokens_out,
        "cost": str(job.cost),
        "model_calls": job.model_calls,
        "tool_calls": job.tool_calls,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


def job_summary(job: Job) -> dict:
    """A job as the tools report it (a ``list_jobs`` row, ``job_output``'s details); the API's
    fuller shape is ``execution_shape``."""
    return {"job_id": job.pk, "kind": job.kind, "status": job.status, "version": job.version,
            "is_error": job.is_error, "error_code": job.error_code}


def branch_shape(branch, busy: bool) -> dict:
    return {
        "id": branch.pk,
        "session": branch.session_id,
        "address": branch.address,
        "name": branch.display_name,
        "name_stage": branch.name_stage,
        "archived": branch.archived,
        "archived_at": branch.archived_at,
        "archive_reason": branch.archive_reason,
        "busy": busy,
        "turns": branch.turns,
        "chars": branch.chars,
        "internal": branch.internal,
        "forked_from": format_address(branch.forked_from.session_id, branch.forked_from_id) if branch.forked_from_id else None,
        "created_at": branch.created_at,
        "last_active_at": branch.last_active_at,
    }


def branch_usage(branch_ids) -> dict:
    """Per-branch token and cost totals (one grouped query)."""
    rows = Job.objects.filter(branch_id__in=branch_ids).values("branch_id").annotate(
        tokens_in=Sum("tokens_in"), tokens_out=Sum("tokens_out"), cost=Sum("cost"))
    return {r["branch_id"]: {"tokens_in": r["tokens_in"] or 0, "tokens_out": r["tokens_out"] or 0,
                             "cost": str(r["cost"] or 0)} for r in rows}

"""The one place collab rows are fetched and authorized (SPEC §8, STYLE §3).

Every entry point — pages, API, WebSocket, tools, admin actions — goes through
these helpers. The membership check runs *before* the target row is loaded
where the id alone allows it, and outsiders always get the same ``NotFound``
as for a missing id, so neither answers nor work done leak existence.

Row-level visibility (issue 17, OP §5.9) lives here too: ``visible_sessions(user)`` is the ONE
queryset of sessions a person (and every agent acting for them) may see, and every helper
below filters through it, so a private or shared session one may not see answers exactly
like a missing id. A child session follows its root session's visibility.
"""

from django.db.models import Q

from accounts.models import Project
from accounts.policy import (
    has_capability,
    lesser_role,
    member_project_ids,
    project_ids_with,
    role_allows,
    role_of,
)
from collab.errors import Forbidden, NotFound
from collab.models import Branch, Job, Message, Session, SessionShare, Visibility, Webhook


def _open_to(user, root: str) -> Q:
    """The root session (reached through ``root``) shows itself to ``user`` as a non-maintainer."""
    shared_with = SessionShare.objects.filter(user=user).values("session_id")
    return (
        Q(**{f"{root}visibility": Visibility.PROJECT})
        | Q(**{f"{root}created_by": user.pk})
        | Q(**{f"{root}visibility": Visibility.SHARED, f"{root}pk__in": shared_with})
    )


def visible_sessions(user):
    """Every session ``user`` may see, as one queryset (no per-row checks): sessions of their
    accepted projects whose root is ``project``-wide, theirs, shared with them — or any, where
    they are a maintainer or owner. Listings filter with it; ``visible_session_ids`` for rows
    hanging off sessions."""
    if not user or not user.is_authenticated:
        return Session.objects.none()
    return Session.objects.filter(project_id__in=member_project_ids(user)).filter(
        Q(project_id__in=project_ids_with(user, "session.see_all"))
        | (Q(parent_session__isnull=True) & _open_to(user, ""))
        | (Q(parent_session__isnull=False) & _open_to(user, "parent_session__"))
    )


def visible_session_ids(user):
    """``visible_sessions`` as a subquery of ids: ``rows.filter(session_id__in=visible_session_ids(user))``."""
    return visible_sessions(user).values("pk")


def session_role(user, session: Session) -> str | None:
    """The user's effective role in ``session``: their project role, narrowed to their share's
    role in a ``shared`` session (the lesser of the two); None when they may not see it."""
    role = role_of(user, session.project_id)
    if role is None or role_allows(role, "session.see_all"):
        return role
    root = session.parent_session if session.parent_session_id else session
    if root.visibility == Visibility.PROJECT or root.created_by_id == user.pk:
        return role
    if root.visibility == Visibility.SHARED:
        shared = SessionShare.objects.filter(session_id=root.pk, user=user).values_list("role", flat=True).first()
        if shared:
            return lesser_role(role, shared)
    return None


def _checked(role: str | None, capability: str) -> str:
    """NotFound when there is no role (outsiders look like a missing id), Forbidden when too low."""
    if role is None:
        raise NotFound()
    if not role_allows(role, capability):
        raise Forbidden(f"your role ({role}) does not allow {capability}")
    return role


def require_in_session(user, session: Session, capability: str) -> str:
    """The user's effective role in the session; NotFound if they may not see it, Forbidden if too low."""
    return _checked(session_role(user, session), capability)


def can_in_session(user, session: Session, capability: str) -> bool:
    return role_allows(session_role(user, session), capability)


def require_in_project(user, project_id: int, capability: str) -> str:
    """The user's role in the project; NotFound for outsiders, Forbidden for too-low roles."""
    return _checked(role_of(user, project_id), capability)


def access_project(user, slug: str, capability: str = "project.read") -> Project:
    project = Project.objects.filter(slug=slug, pk__in=member_project_ids(user)).first() if user.is_authenticated else None
    if project is None:
        raise NotFound()
    require_in_project(user, project.pk, capability)
    return project


def _project_id_of_session(session_id: str) -> int | None:
    return Session.objects.filter(pk=session_id).values_list("project_id", flat=True).first()


def _within(project_id: int | None) -> dict:
    """Agents stay in their project (SPEC §8): an agent-side lookup passes the acting branch's
    project, and a row of any other project answers like a missing one."""
    return {} if project_id is None else {"project_id": project_id}


def access_session(user, session_id: str, capability: str = "project.read", *, project_id: int | None = None) -> Session:
    """The session if the user may do ``capability`` in its project (and it is in ``project_id``,
    when an agent asks).

    The membership check is folded into the lookup so an outsider's request
    costs exactly what a request for a missing id costs.
    """
    if not user or not user.is_authenticated:
        raise NotFound()
    session = (
        visible_sessions(user).select_related("project", "agent_spec", "parent_session")
        .filter(pk=session_id, **_within(project_id))
        .first()
    )
    if session is None:
        raise NotFound()
    require_in_session(user, session, capability)
    return session


def access_job(user, job_id: str, capability: str = "project.read", *, project_id: int | None = None) -> Job:
    if not user or not user.is_authenticated:
        raise NotFound()
    job = (
        Job.objects.select_related("session", "session__parent_session", "branch")
        .filter(pk=job_id, session_id__in=visible_session_ids(user), **_within(project_id))
        .first()
    )
    if job is None:
        raise NotFound()
    require_in_session(user, job.session, capability)
    return job


def access_message(user, session_id: str, message_id: str, capability: str = "project.read", *,
                   project_id: int | None = None) -> Message:
    session = access_session(user, session_id, capability, project_id=project_id)
    message = Message.objects.filter(pk=message_id, session=session).select_related("branch").first()
    if message is None:
        raise NotFound()
    return message


def access_branch_by_id(user, branch_id: str, capability: str = "project.read") -> Branch:
    if not user or not user.is_authenticated:
        raise NotFound()
    branch = (
        Branch.objects.select_related("session", "session__project", "session__parent_session")
        .filter(pk=branch_id, session_id__in=visible_session_ids(user))
        .first()
    )
    if branch is None:
        raise NotFound()
    require_in_session(user, branch.session, capability)
    return branch


def require_can_set_internal(user, branch: Branch) -> str:
    """Who may mark a branch internal or not (issue 14 item 6): maintainers and owners, by their
    effective role in its session (``branch.internal``). One who may not see the session gets the
    ``NotFound`` of a missing id; a member or viewer gets ``Forbidden``."""
    return require_in_session(user, branch.session, "branch.internal")


def require_can_cancel(user, job: Job) -> str:
    """Who may cancel an execution (SPEC §8, issue 17): by the effective role in its session —
    a maintainer any execution (``runtime.control``), a member the ones they started
    (``execution.cancel_own``). One who may not see the session gets the ``NotFound`` of a
    missing id; a share narrower than the project role (a viewer's) gets ``Forbidden``."""
    role = session_role(user, job.session)
    if role is None:
        raise NotFound()
    if role_allows(role, "runtime.control"):
        return role
    if role_allows(role, "execution.cancel_own") and job.started_by_id == getattr(user, "pk", None):
        return role
    raise Forbidden(f"your role in this session ({role}) may only cancel executions you started"
                    if role_allows(role, "execution.cancel_own") else f"your role in this session ({role}) may not cancel executions")


def can(user, project_id: int, capability: str) -> bool:
    return has_capability(user, project_id, capability)


def access_artifact(user, artifact_id: str):
    """An artifact is readable exactly by those who may read its execution."""
    from collab.models import Artifact

    if not user or not user.is_authenticated:
        raise NotFound()
    artifact = Artifact.objects.filter(pk=artifact_id, project_id__in=member_project_ids(user),
                                       session_id__in=visible_session_ids(user)).first()
    if artifact is None:
        raise NotFound()
    access_job(user, artifact.job_id)
    return artifact


def access_webhook(user, webhook_id: str, capability: str = "project.webhooks") -> Webhook:
    """A project webhook, for maintainers and owners of its project (issue 16 item 4): its URL
    may itself be a credential (a chat service's incoming-webhook URL), so members and viewers
    get ``Forbidden`` even to read it; anyone outside the project the ``NotFound`` of a missing
    id. The membership check is part of the lookup."""
    if not user or not user.is_authenticated:
        raise NotFound()
    webhook = (Webhook.objects.select_related("project")
               .filter(pk=webhook_id, project_id__in=member_project_ids(user)).first())
    if webhook is None:
        raise NotFound()
    require_in_project(user, webhook.project_id, capability)
    return webhook

"""The one place collab rows are fetched and authorized (SPEC §8, STYLE §3).

Every entry point — pages, API, WebSocket, tools, admin actions — goes through
these helpers. The membership check runs *before* the target row is loaded
where the id alone allows it, and outsiders always get the same ``NotFound``
as for a missing id, so neither answers nor work done leak existence.
"""

from accounts.models import Project
from accounts.policy import has_capability, member_project_ids, role_allows, role_of
from collab.errors import Forbidden, NotFound
from collab.models import Branch, Job, Message, Session


def _require(user, project_id: int, capability: str) -> str:
    """The user's role in the project; NotFound for outsiders, Forbidden for too-low roles."""
    role = role_of(user, project_id)
    if role is None:
        raise NotFound()
    if not role_allows(role, capability):
        raise Forbidden(f"your role ({role}) does not allow {capability}")
    return role


def access_project(user, slug: str, capability: str = "project.read") -> Project:
    project = Project.objects.filter(slug=slug, pk__in=member_project_ids(user)).first() if user.is_authenticated else None
    if project is None:
        raise NotFound()
    _require(user, project.pk, capability)
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
        Session.objects.select_related("project", "agent_spec")
        .filter(pk=session_id, project_id__in=member_project_ids(user), **_within(project_id))
        .first()
    )
    if session is None:
        raise NotFound()
    _require(user, session.project_id, capability)
    return session


def access_job(user, job_id: str, capability: str = "project.read", *, project_id: int | None = None) -> Job:
    if not user or not user.is_authenticated:
        raise NotFound()
    job = (
        Job.objects.select_related("session", "branch")
        .filter(pk=job_id, project_id__in=member_project_ids(user), **_within(project_id))
        .first()
    )
    if job is None:
        raise NotFound()
    _require(user, job.project_id, capability)
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
        Branch.objects.select_related("session", "session__project")
        .filter(pk=branch_id, session__project_id__in=member_project_ids(user))
        .first()
    )
    if branch is None:
        raise NotFound()
    _require(user, branch.session.project_id, capability)
    return branch


def can(user, project_id: int, capability: str) -> bool:
    return has_capability(user, project_id, capability)


def access_artifact(user, artifact_id: str):
    """An artifact is readable exactly by those who may read its execution."""
    from collab.models import Artifact

    if not user or not user.is_authenticated:
        raise NotFound()
    artifact = Artifact.objects.filter(pk=artifact_id, project_id__in=member_project_ids(user)).first()
    if artifact is None:
        raise NotFound()
    access_job(user, artifact.job_id)
    return artifact

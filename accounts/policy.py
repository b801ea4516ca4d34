"""Roles → capabilities (docs/contract.md#roles-and-capabilities). The one place a capability is decided.

Row-level rules (own branches, own executions, holds, job ownership, acting as a branch) are
applied by ``collab.access`` on top of these project-level capabilities.
"""

from django.db.models import DateTimeField
from django.utils import timezone

from accounts.models import ApiToken, Membership, Project, Role, hash_token
from collab.infra.prepared import Param, Select

ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.MAINTAINER: 3, Role.OWNER: 4}

# capability -> least role that has it
CAPABILITIES = {
    "project.read": Role.VIEWER,
    "turn.start": Role.MEMBER,  # start turns, send, delegate, fork
    "branch.archive_own": Role.MEMBER,
    "execution.cancel_own": Role.MEMBER,
    "branch.archive_any": Role.MAINTAINER,
    "branch.act_any": Role.MAINTAINER,  # act through the tool gateway as a branch someone else started
    "runtime.control": Role.MAINTAINER,  # cancel any execution
    "project.visibility": Role.MAINTAINER,
    "agent_spec.manage": Role.MAINTAINER,  # save and edit a project's agent specs (API and pages alike)
    "branch.internal": Role.MAINTAINER,  # mark a branch internal: hidden from agents
    "session.see_all": Role.MAINTAINER,  # see private and shared sessions, change any session's visibility
    "project.audit": Role.MAINTAINER,
    "project.webhooks": Role.MAINTAINER,  # register, change, delete webhooks, rotate their secrets, read deliveries
    "project.members": Role.OWNER,
    "project.settings": Role.OWNER,
}


def role_allows(role: str | None, capability: str) -> bool:
    if role is None:
        return False
    try:
        needed = CAPABILITIES[capability]
    except KeyError:
        raise ValueError(f"unknown capability {capability!r}") from None
    return ROLE_RANK[Role(role)] >= ROLE_RANK[needed]


def role_of(user, project: Project | int) -> str | None:
    """The user's role in the project, or None for non-members, pending invitees and anonymous users."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    project_id = project.pk if isinstance(project, Project) else project
    return member_roles(user).filter(project_id=project_id).values_list("role", flat=True).first()


def member_roles(user):
    """The user's accepted memberships: the ONE place a membership turns into access.
    A pending invitation is not among them: nothing of the project reaches an invitee."""
    if user is None or not user.is_authenticated or not user.is_active:
        return Membership.objects.none()
    return roles_of_user_id(user.pk)


def roles_of_user_id(user_id):
    """``member_roles`` of a user already known to be active and signed in, by id — or by an
    expression of one (a prepared statement's ``Param``: ``collab.access``)."""
    return Membership.objects.accepted().filter(user_id=user_id)


def member_project_ids(user):
    """Ids of the projects the user has accepted (a subquery): filter rows with
    ``project_id__in=member_project_ids(user)`` instead of joining ``memberships`` by hand."""
    return member_roles(user).values("project_id")


def project_ids_with(user, capability: str):
    """Ids of the user's accepted projects where their role has ``capability`` (a subquery)."""
    needed = ROLE_RANK[CAPABILITIES[capability]]
    roles = [role for role, rank in ROLE_RANK.items() if rank >= needed]
    return member_roles(user).filter(role__in=roles).values("project_id")


def member_ids_with(project_id: int, capability: str):
    """Ids of the project's accepted, active members whose role has ``capability`` (a subquery):
    who may be told of something to decide there."""
    needed = ROLE_RANK[CAPABILITIES[capability]]
    roles = [role for role, rank in ROLE_RANK.items() if rank >= needed]
    return (Membership.objects.accepted().filter(project_id=project_id, role__in=roles, user__is_active=True)
            .values("user_id"))


def lesser_role(a: str, b: str) -> str:
    return a if ROLE_RANK[Role(a)] <= ROLE_RANK[Role(b)] else b


def has_capability(user, project: Project | int, capability: str) -> bool:
    return role_allows(role_of(user, project), capability)


def visible_projects(user):
    """Projects the user is a member of (any role, invitation accepted)."""
    return Project.objects.filter(pk__in=member_project_ids(user))


def own_tokens(user):
    """The API tokens ``user`` may list and revoke: their own, and only theirs. The ONE
    token-ownership rule; ``collab.access.access_token`` fetches one through it (anyone else's
    reads as missing). Operators revoke any token in the admin, by its permission."""
    if user is None or not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user)


def user_for_token(raw: str):
    """The active user behind a bearer token, recording its use; None if unknown or revoked."""
    token = token_for(raw)
    return token.user if token is not None else None


# every API request reads its token: one statement, compiled once per process (collab.infra.prepared)
_TOKEN = Select("token_for", lambda: ApiToken.objects.active(Param("now", DateTimeField())).select_related("user")
                .filter(key_hash=Param("hash"), user__is_active=True)[:1])


def token_for(raw: str):
    """The active, unrevoked token (with its user) for a raw bearer value, recording its use."""
    if not raw:
        return None
    now = timezone.now()
    token = _TOKEN.first(hash=hash_token(raw), now=now)
    if token is None:
        return None
    # Only touch the row when it is stale, so busy clients don't write on every request.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token

"""Who is in a project, and the invitations waiting for a person (membership is an invitation:
docs/contract.md#visibility)."""

from accounts.models import Membership


def members_of(project):
    """The project's memberships, accepted and pending, by username (owners see both; each row's
    ``status`` says which). Callers authorized the project."""
    return project.memberships.select_related("user", "invited_by").order_by("user__username")


def invitations_of(user):
    """The user's own pending invitations, newest first: the only thing of a project an
    invitee sees (its slug and name, the role offered, who invited them)."""
    if user is None or not user.is_authenticated:
        return Membership.objects.none()
    return Membership.objects.pending().filter(user=user).select_related("project", "invited_by").order_by("-created_at")

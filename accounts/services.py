from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Membership, Project, Role


class SlugTaken(Exception):
    pass


def create_project(user, *, slug: str, name: str) -> Project:
    """A new project owned by ``user`` (an accepted membership: the creator needs no invitation)."""
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=slug, name=name or slug)
            Membership.objects.create(user=user, project=project, role=Role.OWNER, accepted_at=timezone.now())
    except IntegrityError:
        raise SlugTaken(slug) from None
    return project


class MembershipError(Exception):
    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def _check_role(role: str) -> str:
    if role not in Role.values:
        raise MembershipError(f"role must be one of {', '.join(Role.values)}", "invalid_role")
    return role


def _keeps_an_owner(project: Project, membership: Membership, new_role: str | None) -> None:
    """A project always keeps an owner: refuse demoting or removing the last one.
    Only accepted owners count: a pending owner invitation may never be answered."""
    if membership.accepted_at is not None and membership.role == Role.OWNER and new_role != Role.OWNER:
        others = (
            Membership.objects.accepted().select_for_update()
            .filter(project=project, role=Role.OWNER).exclude(pk=membership.pk)
        )
        if not others.exists():
            raise MembershipError("a project must keep at least one owner", "last_owner")


def add_member(project: Project, user, role: str, invited_by=None) -> Membership:
    """Invite ``user``: a pending membership that gives nothing until they accept it."""
    _check_role(role)
    with transaction.atomic():
        existing = Membership.objects.filter(project=project, user=user).first()
        if existing is not None and existing.accepted_at is None:
            raise MembershipError(f"{user.username} is already invited", "already_invited")
        if existing is not None:
            raise MembershipError(f"{user.username} is already a member", "already_member")
        return Membership.objects.create(project=project, user=user, role=role, accepted_at=None, invited_by=invited_by)


def _own_invitation(user, invitation_id: int) -> Membership:
    """The user's own pending invitation, locked; anyone else's (or none) is "not found"."""
    invitation = Membership.objects.pending().select_for_update().filter(pk=invitation_id, user=user).first()
    if invitation is None:
        raise MembershipError("no such invitation", "not_found")
    return invitation


def accept_invitation(user, invitation_id: int) -> Membership:
    with transaction.atomic():
        invitation = _own_invitation(user, invitation_id)
        invitation.accepted_at = timezone.now()
        invitation.save(update_fields=["accepted_at"])
        return invitation


def decline_invitation(user, invitation_id: int) -> Membership:
    """Delete the invitation; the returned (unsaved) row says what was declined."""
    with transaction.atomic():
        invitation = _own_invitation(user, invitation_id)
        invitation.delete()
        return invitation


def change_role(project: Project, user, role: str) -> Membership:
    _check_role(role)
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(project=project, user=user).first()
        if membership is None:
            raise MembershipError(f"{user.username} is not a member", "not_member")
        _keeps_an_owner(project, membership, role)
        membership.role = role
        membership.save(update_fields=["role"])
        return membership


def remove_member(project: Project, user) -> Membership:
    """Remove a member, or cancel a pending invitation; the returned row says which it was."""
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(project=project, user=user).first()
        if membership is None:
            raise MembershipError(f"{user.username} is not a member", "not_member")
        _keeps_an_owner(project, membership, None)
        membership.delete()
        return membership


def revoke_token(token) -> None:
    from django.utils import timezone

    type(token).objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())

from django.db import IntegrityError, transaction

from accounts.models import Membership, Project, Role


class SlugTaken(Exception):
    pass


def create_project(user, *, slug: str, name: str) -> Project:
    """A new project owned by ``user``."""
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=slug, name=name or slug)
            Membership.objects.create(user=user, project=project, role=Role.OWNER)
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
    """A project always keeps an owner: refuse demoting or removing the last one."""
    if membership.role == Role.OWNER and new_role != Role.OWNER:
        others = Membership.objects.select_for_update().filter(project=project, role=Role.OWNER).exclude(pk=membership.pk)
        if not others.exists():
            raise MembershipError("a project must keep at least one owner", "last_owner")


def add_member(project: Project, user, role: str) -> Membership:
    _check_role(role)
    with transaction.atomic():
        if Membership.objects.filter(project=project, user=user).exists():
            raise MembershipError(f"{user.username} is already a member", "already_member")
        return Membership.objects.create(project=project, user=user, role=role)


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


def remove_member(project: Project, user) -> None:
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(project=project, user=user).first()
        if membership is None:
            raise MembershipError(f"{user.username} is not a member", "not_member")
        _keeps_an_owner(project, membership, None)
        membership.delete()


def revoke_token(token) -> None:
    from django.utils import timezone

    type(token).objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())

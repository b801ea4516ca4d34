from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import ngettext
from datetime import UTC

from accounts.models import ApiToken, Membership, Profile, Project, Role, TokenScope, default_token_scopes


class SlugTaken(Exception):
    pass


class ProjectLimitReached(Exception):
    def __init__(self, limit: int):
        super().__init__(f"you already own {limit} {ngettext('project', 'projects', limit)}, the most one person "
                         "may own here (TRELLIS_MAX_PROJECTS_PER_USER); ask the operator, or give one to another owner")
        self.limit = limit


def create_project(user, *, slug: str, name: str) -> Project:
    """A new project owned by ``user`` (an accepted membership: the creator needs no invitation),
    unless they own ``TRELLIS_MAX_PROJECTS_PER_USER`` already (staff are exempt). The user's row is
    locked first, so two creations at once cannot both take the last one."""
    try:
        with transaction.atomic():
            limit = settings.TRELLIS_MAX_PROJECTS_PER_USER
            if limit and not user.is_staff:
                user._meta.model.objects.select_for_update().filter(pk=user.pk).first()  # (a page's user is lazy)
                owned = Membership.objects.accepted().filter(user=user, role=Role.OWNER).count()
                if owned >= limit:
                    raise ProjectLimitReached(limit)
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


class TokenError(Exception):
    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


MAX_TOKEN_NAME = 100


def utc_expiry(expires_at):
    """``expires_at`` in UTC (what is stored): any offset the client wrote is resolved here, and a
    moment that leaves the calendar in UTC (year 9999 at a negative offset) is ``invalid_expiry``
    — the database would refuse it, or store what it cannot read back."""
    if expires_at is None:
        return None
    try:
        utc = expires_at.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or utc.year >= 9999:
        raise TokenError("expires_at must be a moment before the year 9999 (UTC)", "invalid_expiry")
    return utc


def check_token_request(*, name: str, scopes, expires_at, minted_by: ApiToken | None) -> list[str]:
    """Validate a token request; returns the scopes in canonical order (raises ``TokenError``).

    A token minting another (``minted_by``) cannot hand out more than it has: the new
    token's scopes are a subset of its own and it expires no later than it does. Without
    ``scopes`` a token gets the default set (read, write, tools)."""
    if len(name or "") > MAX_TOKEN_NAME:
        raise TokenError(f"name must be at most {MAX_TOKEN_NAME} characters", "invalid_token_name")
    if scopes is None:  # the default set, narrowed to what a minting token has
        scopes = [s for s in default_token_scopes() if minted_by is None or minted_by.allows(s)]
    if not isinstance(scopes, (list, tuple)) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise TokenError(f"scopes must be a non-empty list of: {', '.join(TokenScope.values)}", "invalid_scopes")
    unknown = sorted(set(scopes) - set(TokenScope.values))
    if unknown:
        raise TokenError(f"unknown scopes {', '.join(unknown)}; known: {', '.join(TokenScope.values)}", "invalid_scopes")
    if expires_at is not None and expires_at <= timezone.now():
        raise TokenError("expires_at must be in the future", "invalid_expiry")
    if minted_by is not None:
        wider = sorted(set(scopes) - set(minted_by.scopes or []))
        if wider:
            raise TokenError(f"a token cannot grant scopes it lacks: {', '.join(wider)}", "scope_escalation")
        if minted_by.expires_at is not None and (expires_at is None or expires_at > minted_by.expires_at):
            raise TokenError("a token cannot mint a token that outlives it (set expires_at no later than its own)",
                             "expiry_escalation")
    return [s for s in TokenScope.values if s in scopes]


def issue_token(user, *, name: str = "", scopes=None, expires_at=None, minted_by: ApiToken | None = None):
    """A new token for ``user``: (row, raw value shown once)."""
    expires_at = utc_expiry(expires_at)
    scopes = check_token_request(name=name, scopes=scopes, expires_at=expires_at, minted_by=minted_by)
    return ApiToken.issue(user, name=name or "", scopes=scopes, expires_at=expires_at, issued_by=minted_by)


def revoke_token(token) -> list[int]:
    """Revoke the token and every token minted from it (transitively); returns the ids revoked now."""
    now = timezone.now()
    revoked, level = [], [token.pk]
    while level:
        ids = list(ApiToken.objects.filter(pk__in=level, revoked_at__isnull=True).values_list("pk", flat=True))
        ApiToken.objects.filter(pk__in=ids).update(revoked_at=now)
        revoked += ids
        level = list(ApiToken.objects.filter(issued_by_id__in=level).exclude(pk__in=revoked).values_list("pk", flat=True))
    return revoked


def note_home_visit(user, now=None):
    """Record that ``user`` opens the home page now; return when they last opened it before (None
    the first time), where its "finished since your last visit" starts. Two statements (three the
    first time); of two visits at once, the last write stays."""
    now = now or timezone.now()
    previous = Profile.objects.filter(user=user).values_list("last_home_visit", flat=True).first()
    if not Profile.objects.filter(user=user).update(last_home_visit=now):
        Profile.objects.get_or_create(user=user, defaults={"last_home_visit": now})  # a first visit
    return previous

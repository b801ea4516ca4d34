"""Who sees a session (docs/contract.md#visibility): its visibility and share list.

The creator of a session or a maintainer/owner of its project changes them — from the session
page, the API and the admin, all through these functions. Each change is an audited session
Event (``session.visibility_changed``, ``session.shared``, ``session.unshared``); the sockets
following the session (and its sub-agents' sessions) re-check their access when it commits and
close if it is gone, and a running turn of someone who lost access is refused at its next tool
call (``Actor.require_standing``). Nothing is deleted: a share row stays until it is unshared and
counts only while the session is ``shared``. Who may *see* what is decided in ``collab.access``.
"""

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.policy import ROLE_RANK, role_of
from accounts.models import Role
from collab.access import can_change_visibility, require_can_change_visibility
from collab.errors import Invalid, NotFound
from collab.events import send_event_on_commit
from collab.models import Session, SessionShare, Visibility
from collab.models.sessions import SHARE_ROLES
from collab.services.members import send_to_session_sockets

MAX_SHARES = 200


def _check(user, session: Session, *, operator: bool) -> None:
    if session.is_child:
        raise Invalid("a sub-agent's session follows its root session's visibility; change that one",
                      code="child_session_visibility")
    if not operator:
        require_can_change_visibility(user, session)


def _lock(session: Session) -> Session:
    return Session.objects.select_for_update().get(pk=session.pk)


def _recheck_sockets(session: Session) -> None:
    children = list(Session.objects.filter(parent_session_id=session.pk).values_list("pk", flat=True))
    transaction.on_commit(lambda: send_to_session_sockets([session.pk, *children], session.project_id))


def do_set_visibility(user, session: Session, visibility: str, *, operator: bool = False) -> Session:
    """Set ``project`` / ``private`` / ``shared``. ``operator``: an operator in the admin,
    authorized there. Preconditions: ``session`` came from ``access_session`` (or the admin)."""
    if visibility not in Visibility.values:
        raise Invalid(f"visibility must be one of {', '.join(Visibility.values)}", code="invalid_visibility")
    _check(user, session, operator=operator)
    with transaction.atomic():
        locked = _lock(session)
        if locked.visibility == visibility:
            return locked
        previous = locked.visibility
        Session.objects.filter(pk=locked.pk).update(visibility=visibility)
        locked.visibility = visibility
        send_event_on_commit(locked.pk, "session.visibility_changed",
                             {"session": locked.pk, "from": previous, "to": visibility}, actor=user)
        _recheck_sockets(locked)
    return locked


def _member(session: Session, username: str):
    person = get_user_model().objects.filter(username=username, is_active=True).first()
    role = role_of(person, session.project_id) if person is not None else None
    if role is None:
        raise NotFound(f"no member of this project is named {username!r}", code="not_member")
    return person, role


def _share_role(role: str, project_role: str, username: str) -> str:
    if role not in SHARE_ROLES:
        raise Invalid(f"role must be one of {', '.join(SHARE_ROLES)}", code="invalid_role")
    if ROLE_RANK[Role(role)] > ROLE_RANK[Role(project_role)]:
        raise Invalid(f"{username} is a {project_role} of the project: a share cannot give more ({role})",
                      code="share_role_too_wide")
    return role


def do_set_shares(user, session: Session, shares: dict[str, str], *, operator: bool = False) -> list[SessionShare]:
    """Make the share list exactly ``shares`` ({username: role}): new and changed rows are
    ``session.shared`` events, removed ones ``session.unshared``. All or nothing."""
    _check(user, session, operator=operator)
    if len(shares) > MAX_SHARES:
        raise Invalid(f"at most {MAX_SHARES} people per session", code="too_many_shares")
    wanted = {}
    for username, role in shares.items():
        person, project_role = _member(session, username)
        wanted[person.pk] = (person, _share_role(role, project_role, username))
    with transaction.atomic():
        locked = _lock(session)
        current = {s.user_id: s for s in SessionShare.objects.filter(session=locked).select_related("user")}
        narrowed = False
        for user_id, row in current.items():
            if user_id not in wanted:
                row.delete()
                narrowed = True
                send_event_on_commit(locked.pk, "session.unshared", {"username": row.user.username}, actor=user)
        for user_id, (person, role) in wanted.items():
            row = current.get(user_id)
            if row is not None and row.role == role:
                continue
            if row is None:
                SessionShare.objects.create(session=locked, user=person, role=role, created_by=user)
            else:
                narrowed = narrowed or ROLE_RANK[Role(role)] < ROLE_RANK[Role(row.role)]
                SessionShare.objects.filter(pk=row.pk).update(role=role)
            send_event_on_commit(locked.pk, "session.shared", {"username": person.username, "role": role}, actor=user)
        if narrowed:
            _recheck_sockets(locked)
    return shares_of(locked)


def do_share(user, session: Session, username: str, role: str = "viewer", *, operator: bool = False):
    """Add (or change) one person's share."""
    current = {s.user.username: s.role for s in shares_of(session)}
    return do_set_shares(user, session, {**current, username: role}, operator=operator)


def do_unshare(user, session: Session, username: str, *, operator: bool = False):
    """Stop sharing with one person (nothing to do when it was not shared with them)."""
    _check(user, session, operator=operator)
    current = {s.user.username: s.role for s in shares_of(session)}
    if current.pop(username, None) is None:
        return shares_of(session)
    return do_set_shares(user, session, current, operator=operator)


def shares_of(session: Session) -> list[SessionShare]:
    return list(SessionShare.objects.filter(session_id=session.root_id).select_related("user"))


def parse_share_lines(text: str) -> dict[str, str]:
    """The page form's share list: one ``username [role]`` per line (role defaults to viewer)."""
    shares = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if not parts:
            continue
        if len(parts) > 2:
            raise Invalid(f"each line is 'username [role]', not {line.strip()!r}", code="invalid_share")
        shares[parts[0]] = parts[1] if len(parts) == 2 else "viewer"
    return shares


def visibility_context(user, session: Session) -> dict:
    """What the session page shows about who sees the session (its root's settings for a child)."""
    root = session.parent_session if session.is_child else session
    return {
        "visibility": root.visibility,
        "can_change_visibility": not session.is_child and can_change_visibility(user, session),
        "shares": shares_of(root),
        "visibilities": Visibility.values,
    }

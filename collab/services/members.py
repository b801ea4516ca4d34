"""Membership changes as the collab side sees them: audited, and revoking access at once
(open WebSockets of a removed member are closed; SPEC §8, issue: multi-user)."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import services as accounts
from collab.errors import Conflict, Invalid, NotFound
from collab.events import record_project_event

_CODES = {"invalid_role": Invalid, "last_owner": Conflict, "already_member": Conflict, "not_member": NotFound}


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def _user(username: str):
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise NotFound(f"no user named {username!r}", code="unknown_user")
    return user


def _run(fn, *args):
    try:
        return fn(*args)
    except accounts.MembershipError as exc:
        raise _CODES[exc.code](str(exc), code=exc.code) from None


def do_add_member(actor, project, username: str, role: str):
    user = _user(username)
    with transaction.atomic():
        membership = _run(accounts.add_member, project, user, role)
        record_project_event(project.pk, "member.added", {"username": user.username, "role": role}, actor=actor)
    return membership


def do_change_role(actor, project, username: str, role: str):
    user = _user(username)
    with transaction.atomic():
        membership = _run(accounts.change_role, project, user, role)
        record_project_event(project.pk, "member.role_changed", {"username": user.username, "role": role}, actor=actor)
        transaction.on_commit(lambda: _tell_sockets(user.pk, project.pk))
    return membership


def do_remove_member(actor, project, username: str) -> None:
    user = _user(username)
    with transaction.atomic():
        _run(accounts.remove_member, project, user)
        record_project_event(project.pk, "member.removed", {"username": user.username}, actor=actor)
        transaction.on_commit(lambda: _tell_sockets(user.pk, project.pk))


def _tell_sockets(user_id: int, project_id: int) -> None:
    """Ask every socket of the user in this project to re-check its access (and close if gone)."""
    send_to_user(user_id, {"type": "collab.access_changed", "project": project_id})


def send_to_user(user_id: int, message: dict) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(user_group(user_id), message)

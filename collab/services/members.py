"""Membership changes as the collab side sees them: audited, and revoking access at once
(open WebSockets of a removed member are closed).

Adding someone is an *invitation* (docs/contract.md#visibility): it gives nothing until the
person accepts it; they may decline it, and an owner may cancel it. Every step is a
project-level Event: ``member.invited``, ``member.accepted``, ``member.declined``,
``member.invitation_cancelled`` (and ``member.role_changed`` / ``member.removed`` as before)."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts import services as accounts
from collab.errors import Conflict, Invalid, NotFound
from collab.events import record_project_event
from collab.realtime.push import session_group

_CODES = {"invalid_role": Invalid, "last_owner": Conflict, "already_member": Conflict, "already_invited": Conflict,
          "not_member": NotFound, "not_found": NotFound}


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
    """Invite ``username`` with ``role``: a pending membership until they accept it."""
    user = _user(username)
    with transaction.atomic():
        membership = _run(accounts.add_member, project, user, role, actor)
        record_project_event(project.pk, "member.invited", {"username": user.username, "role": role}, actor=actor)
    return membership


def do_accept_invitation(user, invitation_id: int):
    """The invitee accepts: from now on the membership gives its role's access."""
    with transaction.atomic():
        membership = _run(accounts.accept_invitation, user, invitation_id)
        record_project_event(membership.project_id, "member.accepted",
                             {"username": user.username, "role": membership.role}, actor=user)
    return membership


def do_decline_invitation(user, invitation_id: int) -> None:
    """The invitee declines: the invitation is gone and nothing was ever visible to them."""
    with transaction.atomic():
        membership = _run(accounts.decline_invitation, user, invitation_id)
        record_project_event(membership.project_id, "member.declined",
                             {"username": user.username, "role": membership.role}, actor=user)


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
        removed = _run(accounts.remove_member, project, user)
        if removed.accepted_at is None:  # an owner cancels a pending invitation
            record_project_event(project.pk, "member.invitation_cancelled", {"username": user.username}, actor=actor)
            return
        record_project_event(project.pk, "member.removed", {"username": user.username}, actor=actor)
        transaction.on_commit(lambda: _tell_sockets(user.pk, project.pk))


def _tell_sockets(user_id: int, project_id: int) -> None:
    """Ask every socket of the user in this project to re-check its access (and close if gone)."""
    send_to_user(user_id, {"type": "collab.access_changed", "project": project_id})


EVERY_PROJECT = "*"  # an access change that concerns each of the user's sockets


def user_saved(sender, instance, created=False, **kwargs) -> None:
    """A deactivated person's sockets re-check their access after the change commits (and close:
    4403). Connected to the user model's ``post_save`` (``collab.apps``): the admin's change form,
    a script or ``manage.py`` all save through it."""
    if not created and not instance.is_active:
        transaction.on_commit(lambda pk=instance.pk: send_to_user(pk, {"type": "collab.access_changed",
                                                                       "project": EVERY_PROJECT}))


def user_deleted(sender, instance, **kwargs) -> None:
    """A deleted person's sockets close as a deactivated person's do."""
    transaction.on_commit(lambda pk=instance.pk: send_to_user(pk, {"type": "collab.access_changed",
                                                                   "project": EVERY_PROJECT}))


def send_to_user(user_id: int, message: dict) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(user_group(user_id), message)


def send_to_session_sockets(session_ids, project_id: int) -> None:
    """Ask every socket following these sessions to re-check its access (and close if gone):
    a session's visibility or share list narrowed."""
    layer = get_channel_layer()
    if layer is None:
        return
    for session_id in session_ids:
        async_to_sync(layer.group_send)(session_group(session_id), {"type": "collab.access_changed", "project": project_id})

"""API tokens as the collab side sees them (docs/contract.md#authentication): issued and revoked through one door,
audited, and revocation closing the sockets opened with the token at once.

A token is the user's, not a project's; it reaches every project the user belongs to,
so its audit events are recorded in each of those projects (``token.created``,
``token.revoked``: who, which token, its scopes and expiry — never its value or hint).
"""

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from accounts import services as accounts
from accounts.models import ApiToken
from accounts.policy import member_project_ids
from collab.errors import Forbidden, Invalid
from collab.events import record_project_event
from collab.services.members import send_to_user

# the account page's choices: days → expires_at ("" = never)
TOKEN_LIFETIMES = {"": lambda: None, **{d: (lambda n=int(d): timezone.now() + timedelta(days=n)) for d in ("7", "30", "90", "365")}}

_CODES = {"scope_escalation": Forbidden, "expiry_escalation": Forbidden}


def _audit(token: ApiToken, type_: str, actor, **extra) -> None:
    payload = {"token": token.pk, "name": token.name, "user": token.user.username, "scopes": token.scopes,
               "expires_at": token.expires_at.isoformat() if token.expires_at else None, **extra}
    for project_id in member_project_ids(token.user).values_list("project_id", flat=True):
        record_project_event(project_id, type_, payload, actor=actor)


def do_issue_token(actor, user, *, name: str = "", scopes=None, expires_at=None, minted_by: ApiToken | None = None):
    """A new token for ``user``: (row, raw value shown once). ``minted_by`` is the bearer token
    of an API request (its scopes and expiry bound the new one); None for a browser session,
    the account page or the operator's command."""
    with transaction.atomic():
        try:
            token, raw = accounts.issue_token(user, name=name, scopes=scopes, expires_at=expires_at, minted_by=minted_by)
        except accounts.TokenError as exc:
            raise _CODES.get(exc.code, Invalid)(str(exc), code=exc.code) from None
        _audit(token, "token.created", actor, minted_by=getattr(minted_by, "pk", None))
    return token, raw


def do_revoke_token(actor, token: ApiToken) -> list[int]:
    """Revoke a token and the tokens minted from it; sockets opened with them close at once."""
    with transaction.atomic():
        revoked = accounts.revoke_token(token)
        for row in ApiToken.objects.filter(pk__in=revoked).select_related("user"):
            _audit(row, "token.revoked", actor)
        user_id = token.user_id
        for token_id in revoked:
            transaction.on_commit(lambda t=token_id: send_to_user(user_id, {"type": "collab.token_revoked", "token": t}))
    return revoked

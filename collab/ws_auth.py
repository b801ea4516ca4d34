"""WebSocket authentication: the session cookie, or ``Authorization: Bearer`` on the handshake;
the Origin check in front of both."""

from urllib.parse import urlparse

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier

from accounts.models import TokenScope
from accounts.policy import token_for


class BearerTokenMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            found = await database_sync_to_async(token_for)(token.strip())
            if found is not None and found.allows(TokenScope.READ):  # a socket only reads
                scope = dict(scope, user=found.user, api_token_id=found.pk, api_token_expires_at=found.expires_at)
        return await super().__call__(scope, receive, send)


def TokenOrSessionAuthMiddlewareStack(inner):  # noqa: N802 - mirrors channels' naming
    # The session stack runs first and sets scope["user"]; a valid bearer token overrides it.
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))


class _Refusal(WebsocketDenier):
    """channels' denier without a channel of its own: its default alias opens a channel on the
    process's layer and waits on a receive there (with Redis, a connection and a BZPOPMIN per
    refused handshake), where a refusal needs nothing — and a receive that the layer cannot
    serve (a channels-redis receive lock a closed event loop left held) kept the refusal from
    ever ending. An alias no layer has: ``get_channel_layer`` gives None."""

    channel_layer_alias = "trellis.none"


class _OriginCheck:
    """The Origin check of channels' ``AllowedHostsOriginValidator`` (its hosts, its matching),
    refusing with ``_Refusal``."""

    def __init__(self, application):
        self.validator = AllowedHostsOriginValidator(application)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not self.validator.valid_origin(_origin(scope)):
            return await _Refusal()(scope, receive, send)
        return await self.validator(scope, receive, send)


def _origin(scope):
    """The handshake's Origin, parsed as channels' ``OriginValidator`` parses it (None if absent
    or undecodable)."""
    for name, value in scope.get("headers", []):
        if name == b"origin":
            try:
                return urlparse(value.decode("latin1"))
            except UnicodeDecodeError:
                return None
    return None


def OriginCheckedStack(inner):  # noqa: N802 - mirrors channels' naming
    """``AllowedHostsOriginValidator(TokenOrSessionAuthMiddlewareStack(inner))``, whose refusals
    use no channel layer (``_Refusal``)."""
    return _OriginCheck(TokenOrSessionAuthMiddlewareStack(inner))

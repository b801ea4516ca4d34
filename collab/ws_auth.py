"""WebSocket authentication: the session cookie, or ``Authorization: Bearer`` on the handshake."""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

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
                scope = dict(scope, user=found.user, api_token_id=found.pk)
        return await super().__call__(scope, receive, send)


def TokenOrSessionAuthMiddlewareStack(inner):  # noqa: N802 - mirrors channels' naming
    # The session stack runs first and sets scope["user"]; a valid bearer token overrides it.
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))

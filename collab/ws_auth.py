"""WebSocket authentication: the session cookie, or ``Authorization: Bearer`` on the handshake."""

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware

from accounts.policy import user_for_token


class BearerTokenMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            user = await database_sync_to_async(user_for_token)(token.strip())
            if user is not None:
                scope = dict(scope, user=user)
        return await super().__call__(scope, receive, send)


def TokenOrSessionAuthMiddlewareStack(inner):  # noqa: N802 - mirrors channels' naming
    # The session stack runs first and sets scope["user"]; a valid bearer token overrides it.
    return AuthMiddlewareStack(BearerTokenMiddleware(inner))

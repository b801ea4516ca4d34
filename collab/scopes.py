"""Bearer-token scopes on the API (docs/contract.md#authentication): one check for every route.

A request authenticated by a bearer token may do only what the token's scopes allow:
a ``GET`` needs ``read``, any other method ``write``, unless the route declares its own
scope with ``@token_scope`` (the tool gateway ``tools``, creating or revoking tokens
``tokens``, deciding held deliveries ``holds``). A browser session is a person at the
page and is not scoped. Refusals are 403 with code ``token_scope``.
"""

from functools import wraps

from accounts.models import TokenScope
from collab.errors import Forbidden

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def token_scope(scope: str):
    """Declare the scope a route needs from a bearer token (instead of read/write by method)."""
    def mark(view):
        view.token_scope = scope
        return view

    return mark


def request_token(request):
    """The ApiToken that authenticated this API request, or None (browser session)."""
    return getattr(request, "api_token", None)


def scope_needed(view, method: str) -> str:
    return getattr(view, "token_scope", None) or (TokenScope.READ if method in SAFE_METHODS else TokenScope.WRITE)


def require_token_scope(view):
    """The API-wide check (added with ``api.add_decorator``): runs after authentication."""
    @wraps(view)
    def checked(request, *args, **kwargs):
        token = request_token(request)
        if token is not None:
            scope = scope_needed(view, request.method)
            if not token.allows(scope):
                raise Forbidden(f"this token lacks the '{scope}' scope (it has: {', '.join(token.scopes) or 'none'})",
                                code="token_scope", scope=str(scope))
        return view(request, *args, **kwargs)

    return checked

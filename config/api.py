"""The REST API root (SPEC §11.1): auth, the error shape, and the routers.

Errors are always ``{"detail": str, "code": str}``. Clients authenticate with
``Authorization: Bearer <token>``; the browser with its session cookie, in which
case unsafe methods must carry the CSRF token.
"""

from functools import wraps

from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer, SessionAuth
from pydantic import BaseModel

from accounts.policy import token_for
from collab.api import router as collab_router
from collab.errors import DomainError, Invalid
from collab.scopes import require_token_scope


class BearerToken(HttpBearer):
    """An unexpired, unrevoked token; what it may do is checked per route (collab.scopes)."""

    def authenticate(self, request, token):
        found = token_for(token)
        if found is None:
            return None
        request.user = found.user
        request.api_token = found
        return found.user


class BrowserSession(SessionAuth):
    """The browser's session cookie, CSRF enforced. A request without a logged-in session
    is not a browser request: it is left unauthenticated (401) instead of failing the
    CSRF check (403), so a client with a bad or revoked bearer token hears "401"."""

    def __call__(self, request):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return super().__call__(request)


api = NinjaAPI(
    title="Trellis API",
    version="1",
    description="Sessions, branches, turns, executions and the agent tool gateway.",
    auth=[BearerToken(), BrowserSession()],
    urls_namespace="api",
)


def _error(request, http_status: int, detail: str, code: str, /, **extra):
    return api.create_response(request, {**extra, "detail": detail, "code": code}, status=http_status)


@api.exception_handler(DomainError)
def on_domain_error(request, exc: DomainError):
    return _error(request, exc.status, exc.detail, exc.code, **exc.extra)


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    problems = []
    for err in exc.errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "payload"))
        problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return _error(request, 422, "; ".join(problems) or "invalid request", "invalid_request", errors=exc.errors)


@api.exception_handler(AuthenticationError)
def on_authentication_error(request, exc):
    return _error(request, 401, "authentication required: a Bearer token or a logged-in session", "unauthenticated")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    message = str(exc)
    if exc.status_code == 403 and "CSRF" in message:
        return _error(request, 403, "CSRF token missing or incorrect", "csrf_failed")
    if exc.status_code == 400:
        return _error(request, 400, message or "malformed request", "malformed_request")
    return _error(request, exc.status_code, message, f"http_{exc.status_code}")


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, "not found", "not_found")


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, BaseModel):
        return _has_nul(value.model_dump())
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def reject_nul(view):
    """PostgreSQL cannot store NUL in text or jsonb: refuse it in any parameter or body
    with a 400 rather than failing in the database with a 500."""

    @wraps(view)
    def checked(request, *args, **kwargs):
        if _has_nul(args) or _has_nul(kwargs):
            raise Invalid("text must not contain NUL (\\u0000) characters", code="invalid_request")
        return view(request, *args, **kwargs)

    return checked


api.add_decorator(reject_nul)
api.add_decorator(require_token_scope)
api.add_router("/", collab_router)

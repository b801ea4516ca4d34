"""The REST API root (docs/contract.md#http-api): auth, the error shape, and the routers.

Errors are always ``{"detail": str, "code": str}``. Clients authenticate with
``Authorization: Bearer <token>``; the browser with its session cookie, in which
case unsafe methods must carry the CSRF token. JSON bodies pass the text boundary
(``collab.text``) as they are parsed; path and query values pass it in
``collab.middleware.CleanInputMiddleware``.
"""

import json
import math

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import OperationalError
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer, SessionAuth

from accounts.policy import token_for
from collab.api import router as collab_router
from collab.errors import DomainError, Invalid
from collab.middleware import DATABASE_BUSY, database_busy
from collab.scopes import require_token_scope
from collab.inbox_api import router as inbox_router
from collab.streams import router as streams_router
from collab.text import clean_data


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


def _not_a_number(constant: str):
    raise Invalid(f"{constant} is not a JSON number: use a finite number", code="invalid_request")


def _finite(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise Invalid(f"{literal} is too large: use a finite number", code="invalid_request")
    return number


class CleanParser(Parser):
    """JSON bodies: standard JSON only (no ``NaN``/``Infinity``), every string cleaned."""

    def parse_body(self, request):
        try:
            return clean_data(json.loads(request.body, parse_constant=_not_a_number, parse_float=_finite))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise Invalid(f"the body is not valid JSON: {exc}", code="malformed_request") from None


api = NinjaAPI(
    title="Trellis API",
    version="1",
    description="Sessions, branches, turns, executions and the agent tool gateway.",
    auth=[BearerToken(), BrowserSession()],
    urls_namespace="api",
    parser=CleanParser(),
)


def install_error_handlers(api: NinjaAPI, *, credentials: str = "a Bearer token or a logged-in session") -> None:
    """The error shape ``{"detail", "code"}`` for every failure, on ``api`` (this one, and the
    LangGraph-compatible one at ``/lg``: ``config.lg``). ``credentials``: what a 401 asks for."""

    def _error(request, http_status: int, detail: str, code: str, /, **extra):
        return api.create_response(request, {**extra, "detail": detail, "code": code}, status=http_status)

    @api.exception_handler(DomainError)
    def on_domain_error(request, exc: DomainError):
        return _error(request, exc.status, exc.detail, exc.code, **exc.extra)

    @api.exception_handler(OperationalError)
    def on_database_unavailable(request, exc):
        """An exhausted connection pool is a 503 to retry (``collab.middleware.database_busy``);
        any other database failure goes on to Django's handling."""
        if not database_busy(exc):
            raise exc
        response = _error(request, 503, DATABASE_BUSY, "database_busy")
        response["Retry-After"] = "1"
        return response

    @api.exception_handler(ValidationError)
    def on_validation_error(request, exc: ValidationError):
        problems = []
        for err in exc.errors:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "payload"))
            problems.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
        return _error(request, 422, "; ".join(problems) or "invalid request", "invalid_request", errors=exc.errors)

    @api.exception_handler(AuthenticationError)
    def on_authentication_error(request, exc):
        return _error(request, 401, f"authentication required: {credentials}", "unauthenticated")

    @api.exception_handler(HttpError)
    def on_http_error(request, exc: HttpError):
        message = str(exc)
        if exc.status_code == 403 and "CSRF" in message:
            return _error(request, 403, "CSRF token missing or incorrect", "csrf_failed")
        if exc.status_code == 400:
            return _error(request, 400, message or "malformed request", "malformed_request")
        return _error(request, exc.status_code, message, f"http_{exc.status_code}")

    @api.exception_handler(RequestDataTooBig)
    def on_too_big(request, exc):
        # raised when a route first reads a body over DATA_UPLOAD_MAX_MEMORY_SIZE; ninja passes it on
        # to Django, whose answer is an HTML page — an API answers its error shape
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _error(request, 413, f"the request body is larger than {limit} bytes", "request_too_large", limit=limit)

    @api.exception_handler(Http404)
    def on_not_found(request, exc):
        return _error(request, 404, "not found", "not_found")


install_error_handlers(api)
api.add_decorator(require_token_scope)
api.add_router("/", collab_router)
api.add_router("/", streams_router)
api.add_router("/", inbox_router)

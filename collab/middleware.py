"""Project middleware. Each is sync- and async-capable, so an async view (``collab.realtime.subscription``,
the tool gateway) runs on daphne's event loop with no thread held for the request: one
sync-only middleware would park a thread for the whole request."""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.middleware import clickjacking, common, csrf, security
from django.db import OperationalError
from django.http import Http404, HttpResponse, HttpResponseBadRequest, JsonResponse, QueryDict
from django.utils.deprecation import MiddlewareMixin
from psycopg_pool import PoolTimeout
from whitenoise.middleware import WhiteNoiseMiddleware

from collab.errors import DomainError, Forbidden, NotFound
from collab.text import clean_text


class OnTheLoop:
    """For a ``MiddlewareMixin`` whose ``process_request``, ``process_view`` and
    ``process_response`` do no I/O: under ASGI they run on the event loop. Django's mixin runs
    each in the request's thread — a hop there and back for every method of every middleware,
    about twenty per API request here (measured when the web process spent 16.5 ms of CPU per
    turn). Under WSGI and the test client nothing changes. A subclass whose response step may
    reach the database says so in ``needs_thread``; that step then hops as before."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self.stock = "middleware" in settings.TRELLIS_STOCK  # Django's hops (docs/infrastructure.md)
        if iscoroutinefunction(get_response) and hasattr(self, "process_view") and not self.stock:
            # the handler hops to a thread for a plain process_view, not for a coroutine function
            view = self.process_view

            async def process_view(request, view_func, view_args, view_kwargs):
                return view(request, view_func, view_args, view_kwargs)

            self.process_view = process_view

    def needs_thread(self, request) -> bool:
        return False

    async def __acall__(self, request):
        if self.stock:
            return await super().__acall__(request)
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        if hasattr(self, "process_response"):
            if self.needs_thread(request):
                return await sync_to_async(self.process_response, thread_sensitive=True)(request, response)
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(OnTheLoop, security.SecurityMiddleware):
    pass


class CommonMiddleware(OnTheLoop, common.CommonMiddleware):
    pass


class CsrfViewMiddleware(OnTheLoop, csrf.CsrfViewMiddleware):
    """The token is a cookie's, so checking it reads no session: ``CSRF_USE_SESSIONS`` would make
    the check read the session from the database on the event loop, and is refused at start-up
    (``refuse_unsupported_settings``)."""


def refuse_unsupported_settings() -> None:
    """Settings these middleware cannot honour stop every process at start-up (``collab.apps``),
    never at a request."""
    if settings.CSRF_USE_SESSIONS:
        raise ImproperlyConfigured(
            "CSRF_USE_SESSIONS = True is not supported: the CSRF check runs on the event loop "
            "(collab.middleware.OnTheLoop), where the session cannot be read from the database; "
            "keep the CSRF token in its cookie (the default)"
        )


class SessionMiddleware(OnTheLoop, sessions.SessionMiddleware):
    """A session is read lazily, by whoever uses ``request.session`` (in the view's thread); only
    saving a changed one at the response reaches the database."""

    def needs_thread(self, request) -> bool:
        session = getattr(request, "session", None)
        return session is not None and (session.modified or settings.SESSION_SAVE_EVERY_REQUEST)


class AuthenticationMiddleware(OnTheLoop, auth.AuthenticationMiddleware):
    """``request.user`` is lazy: the user is read where it is used."""


class MessageMiddleware(OnTheLoop, messages.MessageMiddleware):
    """Messages are stored at the response only if the request used or added some (then the
    session may be read: in the thread)."""

    def needs_thread(self, request) -> bool:
        storage = getattr(request, "_messages", None)
        return storage is not None and (storage.used or storage.added_new)


class XFrameOptionsMiddleware(OnTheLoop, clickjacking.XFrameOptionsMiddleware):
    pass


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, async-capable: a static file is served as WhiteNoise serves it, anything
    else goes on to the next layer without a thread in between."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, *args, **kwargs):
        super().__init__(get_response, *args, **kwargs)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request):
        static_file = self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve)(static_file, request)
        return await self.get_response(request)


DATABASE_BUSY = "this web process's database connections are all in use; try again in a moment"


def database_busy(exc) -> bool:
    """A request that waited ``DB_POOL_TIMEOUT`` for one of the web process's pooled connections
    (``DB_POOL_MAX_SIZE``) and got none: the process is overloaded, not broken — a 503 to retry
    (API and pages alike), never a 500."""
    return isinstance(exc, OperationalError) and isinstance(exc.__cause__, PoolTimeout)


class DomainErrorMiddleware(MiddlewareMixin):
    """Pages: NotFound → 404, Forbidden → 403, other domain errors → 400 with the reason; an
    exhausted connection pool → 503 (``database_busy``)."""

    def process_exception(self, request, exc):
        if database_busy(exc):
            return HttpResponse(DATABASE_BUSY, status=503, content_type="text/plain; charset=utf-8",
                                headers={"Retry-After": "1"})
        if isinstance(exc, NotFound):
            raise Http404(exc.detail)
        if isinstance(exc, Forbidden):
            raise PermissionDenied(exc.detail)
        if isinstance(exc, DomainError):
            return HttpResponseBadRequest(f"{exc.code}: {exc.detail}", content_type="text/plain; charset=utf-8")
        return None


API_PREFIXES = ("/api/", "/lg/")


class ApiErrorShapeMiddleware(OnTheLoop, MiddlewareMixin):
    """The APIs' error shape ``{"detail", "code"}`` for what their routers never answer
    themselves: a method a path does not take (405, its ``Allow`` header kept) and a path under
    ``/api/`` or ``/lg/`` that no route matches (404) — JSON, not Django's plain text or HTML page."""

    def process_response(self, request, response):
        if response.status_code not in (404, 405) or not request.path.startswith(API_PREFIXES) \
                or response.get("Content-Type", "").startswith("application/json"):
            return response
        if response.status_code == 404:
            return JsonResponse({"detail": "not found", "code": "not_found"}, status=404)
        allowed = response.get("Allow", "")
        shaped = JsonResponse({"detail": f"{request.method} is not allowed here (allowed: {allowed or 'none'})",
                               "code": "method_not_allowed"}, status=405)
        if allowed:
            shaped["Allow"] = allowed
        return shaped


class CleanInputMiddleware(OnTheLoop, MiddlewareMixin):
    """The text boundary (``collab.text``) for what arrives outside a JSON body: URL path
    values, query strings and form fields of pages and API alike. A NUL (``%00``) becomes
    U+FFFD before any view or lookup sees it, so an id carrying one is simply not found and a
    title carrying one is stored with the replacement, identically on both databases."""

    def process_view(self, request, view_func, view_args, view_kwargs):
        for key, value in list(view_kwargs.items()):
            if isinstance(value, str):
                view_kwargs[key] = clean_text(value)
        request.GET = _clean_querydict(request.GET)
        if request.method == "POST" and request.content_type in _FORM_TYPES:
            request.POST = _clean_querydict(request.POST)
        return None


_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _clean_querydict(data: QueryDict) -> QueryDict:
    if not any(_unstorable(k) or any(_unstorable(v) for v in values) for k, values in data.lists()):
        return data
    cleaned = QueryDict(mutable=True)
    for key, values in data.lists():
        cleaned.setlist(clean_text(key), [clean_text(v) for v in values])
    cleaned._mutable = False
    return cleaned


def _unstorable(value) -> bool:
    return isinstance(value, str) and clean_text(value) != value

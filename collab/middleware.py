"""Project middleware. Each is sync- and async-capable, so an async view (``collab.awaiting``,
the tool gateway) runs on daphne's event loop with no thread held for the request: one
sync-only middleware would park a thread for the whole request."""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import PermissionDenied
from django.db import OperationalError
from django.http import Http404, HttpResponse, HttpResponseBadRequest, QueryDict
from django.utils.deprecation import MiddlewareMixin
from psycopg_pool import PoolTimeout
from whitenoise.middleware import WhiteNoiseMiddleware

from collab.errors import DomainError, Forbidden, NotFound
from collab.text import clean_text


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


class CleanInputMiddleware(MiddlewareMixin):
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

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseBadRequest

from collab.errors import DomainError, Forbidden, NotFound


class DomainErrorMiddleware:
    """Pages: NotFound → 404, Forbidden → 403, other domain errors → 400 with the reason."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if isinstance(exc, NotFound):
            raise Http404(exc.detail)
        if isinstance(exc, Forbidden):
            raise PermissionDenied(exc.detail)
        if isinstance(exc, DomainError):
            return HttpResponseBadRequest(f"{exc.code}: {exc.detail}", content_type="text/plain; charset=utf-8")
        return None

"""Domain errors: one vocabulary for every entry point.

The API renders them as ``{"detail", "code"}`` with their HTTP status, views as
404/403 pages, tools as ``<code>: <detail>`` error results.
"""


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, detail: str, code: str | None = None, **extra):
        super().__init__(detail)
        self.detail = detail
        if code:
            self.code = code
        self.extra = extra


class NotFound(DomainError):
    """Missing and not-visible look the same (docs/contract.md#visibility): never say which."""

    status = 404
    code = "not_found"

    def __init__(self, detail: str = "not found", code: str | None = None, **extra):
        super().__init__(detail, code, **extra)


class Forbidden(DomainError):
    """The caller may see the row but not do this to it."""

    status = 403
    code = "forbidden"


class Conflict(DomainError):
    status = 409
    code = "conflict"


class Invalid(DomainError):
    status = 400
    code = "invalid"

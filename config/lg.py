"""The LangGraph-compatible API root at ``/lg`` (docs/langgraph.md): its authentication and routers.

Clients send a Trellis token in ``x-api-key`` (what ``langgraph-sdk`` sends) or
``Authorization: Bearer``; the browser's session is not accepted here. Errors have the native
API's shape (``{"detail", "code"}``: ``detail`` is what LangGraph clients show), token scopes
apply as on ``/api``."""

import importlib.metadata

from ninja import NinjaAPI
from ninja.security import APIKeyHeader

from accounts.policy import token_for
from collab.scopes import require_token_scope
from config.api import BearerToken, CleanParser, install_error_handlers


class ApiKey(APIKeyHeader):
    """``x-api-key: <Trellis token>``."""

    param_name = "x-api-key"

    def authenticate(self, request, key):
        found = token_for(key) if key else None
        if found is None:
            return None
        request.user = found.user
        request.api_token = found
        return found.user


lg_api = NinjaAPI(
    title="Trellis LangGraph-compatible API",
    version="1",
    description="LangGraph Agent Server routes over Trellis sessions (docs/langgraph.md).",
    auth=[ApiKey(), BearerToken()],
    urls_namespace="lg",
    parser=CleanParser(),
    docs_url=None,
)

install_error_handlers(lg_api, credentials="a Trellis API token in x-api-key or as a Bearer token")
lg_api.add_decorator(require_token_scope)


@lg_api.get("/info", auth=None, response={200: dict}, tags=["server"])
def info(request):
    """What LangGraph's server info says about this server (no token needed, as there: clients
    such as Agent Chat UI ask it before anything else, to know that the URL is an Agent Server).
    It names no tenant's data: the server's version and which optional features it offers."""
    try:
        version = importlib.metadata.version("trellis")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"version": version, "server": "trellis",
            "flags": {"assistants": True, "crons": False, "store": False, "langsmith": False}}


@lg_api.get("/ok", auth=None, response={200: dict}, tags=["server"])
def ok(request):
    """LangGraph's liveness answer (the process is up; ``/readyz`` says whether it can serve)."""
    return {"ok": True}

from collab.lg.assistants import router as assistants_router  # noqa: E402
from collab.lg.runs import router as runs_router  # noqa: E402
from collab.lg.threads import router as threads_router  # noqa: E402

lg_api.add_router("/", assistants_router)
lg_api.add_router("/", threads_router)
lg_api.add_router("/", runs_router)

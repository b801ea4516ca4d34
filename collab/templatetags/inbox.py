"""The inbox's pieces on every page (docs/web-app.md#inbox): the "Needs you" count in the
header and the home page, and the "Waiting for a person" badge on a waiting tool call of the
session page. Each reads once per request, and only when a template shows it."""

from django import template

from collab.selectors.inbox import inbox_count
from collab.selectors.transcript import pretty_arguments
from collab.selectors.waiting import open_turn_specs, waiting_calls
from collab.services.asks import ask_kind_for

register = template.Library()


@register.simple_tag(takes_context=True)
def needs_you(context) -> int:
    """How many items wait for the person (``inbox_count``), read once per request."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return 0
    if not hasattr(request, "_needs_you"):
        request._needs_you = inbox_count(user)
    return request._needs_you


@register.simple_tag(takes_context=True)
def waiting_call(context, message, index: int, tool: str) -> dict | None:
    """What tool call ``index`` (of tool ``tool``) of transcript row ``message`` shows of a
    person: ``{"ask", "kind", "yours"}`` while it waits for one; ``{"may_wait": True}`` while its
    open turn may still stop there (the row then follows its job's changes live, so the badge
    appears when the turn pauses); else None. A replay shows none. Two queries per request."""
    request, session = context.get("request"), context.get("session")
    job_id = getattr(message, "job_id", None)
    if request is None or session is None or context.get("replay") or not job_id:
        return None
    cache = request.__dict__.setdefault("_waiting_calls", {})
    if session.pk not in cache:
        cache[session.pk] = (waiting_calls(request.user, session.pk), open_turn_specs(session.pk))
    asks, specs = cache[session.pk]
    found = asks.get((message.pk, index))
    if found is not None:
        return found
    if job_id in specs and ask_kind_for(specs[job_id], tool, session.project) is not None:
        return {"may_wait": True}
    return None


@register.filter
def pretty_json(value) -> str:
    """A tool call's arguments as people read JSON (indented), as the transcript shows them."""
    return pretty_arguments(value)

"""The inbox routes of the REST API (docs/api.md#inbox): what waits for the caller, and their decisions.

``GET /api/inbox`` lists the pending items the caller may decide across every project and
session they may see — asks (approvals of tool calls, ``ask_person`` questions) and held
deliveries; ``POST /api/inbox/{id}`` decides one (``approve``, with ``arguments`` to edit the
call; ``reject`` with a ``reason``; ``answer`` with the ``answer``). A second decision is 409
``already_decided``; an item the caller may not decide reads like a missing one (404). Bearer
tokens need the ``holds`` scope to decide, as for held deliveries.
"""

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Router, Schema
from pydantic import Field

from accounts.models import TokenScope
from collab import access
from collab.errors import Invalid
from collab.schemas import ErrorOut, StrictIn
from collab.scopes import token_scope
from collab.selectors.inbox import HOLD_PREFIX, MAX_ITEMS, ask_item, hold_item, inbox_items, redacted_items
from collab.services.asks import decide
from collab.services.holds import do_decide_hold
from collab.tools.registry import check_arguments

router = Router()
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut, 422: ErrorOut}


class InboxItemOut(Schema):
    id: str
    kind: Literal["approval", "question", "hold"]
    rule: Literal["spec", "project"] | None = Field(
        default=None, description="an approval's: whose approvals named the tool (the agent spec's or the project's)")
    status: str
    project: str
    session: str
    session_title: str
    branch: str
    branch_name: str
    agent: str | None
    execution: str | None
    tool: str
    arguments: dict[str, Any]
    question: str
    choices: list[str]
    to: str | None
    created_at: Any
    expires_at: Any | None


class InboxOut(Schema):
    items: list[InboxItemOut]


class DecisionIn(StrictIn):
    decision: Literal["approve", "reject", "answer"]
    arguments: dict[str, Any] | None = Field(default=None, description="with approve: the call's arguments, edited")
    reason: str = Field(default="", max_length=2000, description="with reject: why (the agent reads it)")
    answer: str = Field(default="", max_length=20000, description="with answer: the answer to the question")


@router.get("inbox", response={200: InboxOut, **ERRORS}, tags=["inbox"])
def get_inbox(request: HttpRequest, limit: int = 200):
    """The pending approvals, questions and held deliveries the caller may decide, oldest first
    (at most ``limit``, 1–500: outside, the nearest bound)."""
    return {"items": inbox_items(request.auth, limit=max(1, min(limit, MAX_ITEMS)))}


@router.post("inbox/{item_id}", response={200: InboxItemOut, **ERRORS}, tags=["inbox"])
@token_scope(TokenScope.HOLDS)
def decide_item(request: HttpRequest, item_id: str, payload: DecisionIn):
    """Decide one item, once. The turn that waited resumes on a worker."""
    return decide_inbox_item(request.auth, item_id, payload.decision, arguments=payload.arguments,
                             reason=payload.reason, answer=payload.answer)


def decide_inbox_item(user, item_id: str, decision: str, *, arguments=None, reason: str = "", answer: str = "") -> dict:
    """``user``'s decision on inbox item ``item_id`` (an ask's id, or ``hold-<n>``), recorded once;
    returns the item as decided, as ``GET /api/inbox`` shows it. The one path of the API and the
    inbox page (docs/web-app.md#inbox): ``NotFound`` for an item the person may not decide,
    ``Invalid`` for a decision that does not fit it (edited arguments are checked against the
    tool's schema first), ``Conflict`` (``already_decided``) for a second decision."""
    if item_id.startswith(HOLD_PREFIX):
        number = item_id[len(HOLD_PREFIX):]
        hold = access.access_hold(user, int(number) if number.isdigit() and len(number) < 19 else -1)
        if decision not in ("approve", "reject"):
            raise Invalid("a held delivery is decided with 'approve' or 'reject'", code="invalid_decision")
        if arguments is not None:
            raise Invalid("a held delivery cannot be edited: approve or reject it", code="invalid_arguments")
        hold = do_decide_hold(user, hold, approve=decision == "approve")
        return redacted_items(user, [hold_item(hold)])[0]
    ask = access.access_ask(user, item_id)
    if decision == "approve" and arguments is not None:
        arguments = check_arguments(ask.job.agent_spec.toolset if ask.job.agent_spec_id else "collab", ask.tool, arguments)
    decided = decide(user, ask, decision, arguments=arguments, reason=reason, answer=answer)
    decided = type(ask).objects.select_related("project", "session", "branch", "job__agent_spec", "to_user").get(pk=decided.pk)
    return redacted_items(user, [ask_item(decided)])[0]

"""``ask_person`` (docs/contract.md#ask_person): an agent asks a person and waits for the answer.

The call never runs as the other tools do. In a turn, the turn loop sees it and pauses the turn
for a person (``collab.runtime.loop.pause``, ``collab.services.asks``): the job waits, holding no
worker, until someone who may decide answers in their inbox (``GET /api/inbox``, the inbox page);
the answer is the call's result. ``question_of`` reads the call's arguments for the loop.
"""

from django.contrib.auth import get_user_model
from pydantic import Field, ValidationError

from collab.access import may_be_asked
from collab.tools.registry import ToolParams, ToolResult, register

MAX_QUESTION_CHARS = 4_000
MAX_CHOICES = 20
MAX_CHOICE_CHARS = 200


class AskPersonParams(ToolParams):
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="what you need a person to tell you")
    choices: list[str] = Field(default_factory=list, max_length=MAX_CHOICES, description=(
        "the answers to choose from; empty: any text"))
    to: str = Field(default="", max_length=150, description=(
        "the username of the project member to ask; empty: whoever of the session's members answers first"))


@register("ask_person", toolsets=("collab",), params=AskPersonParams,
          example={"question": "Ship the release notes as drafted?", "choices": ["yes", "no"]}, description="""
Ask a person and wait for their answer, which is this call's result. Your turn pauses until
someone answers in their inbox (it may take hours); nothing else of yours runs meanwhile.
Use it when you need a decision or a fact only a person has. choices: the answers to pick
from (empty: free text); to: a member's username (empty: any member who may answer).""")
def ask_person(ctx, p: AskPersonParams) -> ToolResult:
    # a turn never gets here (its loop pauses at the call); a call from outside a turn has no
    # turn to pause: the caller asks its person itself
    return ToolResult.error("not_in_a_turn", "ask_person pauses an agent's turn; outside a turn, ask the person directly")


def question_of(job, arguments) -> tuple[str, list[str], object] | ToolResult:
    """(question, choices, addressee or None) of an ``ask_person`` call of ``job``'s turn, or the
    error result that answers the call at once (bad arguments, an addressee who may not answer)."""
    if not isinstance(arguments, dict):
        return ToolResult.error("invalid_arguments", "arguments must be a JSON object", tool="ask_person")
    try:
        p = AskPersonParams.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
        return ToolResult.error("invalid_arguments", problems, tool="ask_person")
    choices = [c.strip()[:MAX_CHOICE_CHARS] for c in p.choices if c.strip()]
    to_user = None
    if p.to.strip():
        to_user = get_user_model().objects.filter(username=p.to.strip(), is_active=True).first()
        if to_user is None or not may_be_asked(to_user, job.session):
            return ToolResult.error("unknown_person", f"{p.to.strip()!r} is not a member who may answer in this session",
                                    tool="ask_person")
    return p.question.strip(), choices, to_user

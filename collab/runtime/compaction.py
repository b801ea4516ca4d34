"""Fitting a long branch into a small context window (docs/contract.md#results, its last paragraphs).

When an AgentSpec declares ``limits.context_window`` (tokens), the history sent to the model
keeps the newest messages that fit about 60% of it (the rest is for the system prompt, tool
schemas and the answer), prefixed with a note saying how much was left out. If the person's
real request fell out of the window it is replayed after the note. Delivered results
(``agent_message``), follow-up notices and system notices are *contextual*: they are never
taken for the request, however recent or long they are.
"""

import json
from dataclasses import dataclass, field

from collab.services.results import CHARS_PER_TOKEN

CONTEXTUAL_KINDS = frozenset({"agent_message", "followup", "notice", "attach"})
HISTORY_SHARE = 0.6


@dataclass
class Note:
    """A synthetic user-role node (never stored): what the model reads in place of the omitted part."""

    text: str
    role: str = "user"
    kind: str = "notice"
    tool_calls: list | None = None
    tool_call_id: str = ""
    metadata: dict = field(default_factory=dict)


def is_real_request(message) -> bool:
    return message.role == "user" and message.kind not in CONTEXTUAL_KINDS


def last_real_user(history):
    """The newest user-role message that is a request (a prompt, task or message), not context."""
    return next((m for m in reversed(history) if is_real_request(m)), None)


def _size(message) -> int:
    return len(message.text or "") + (len(json.dumps(message.tool_calls)) if message.tool_calls else 0)


def history_budget(context_window: int | None) -> int | None:
    """Characters of history that fit ``context_window`` tokens, or None for no limit."""
    if not context_window:
        return None
    return int(context_window * CHARS_PER_TOKEN * HISTORY_SHARE)


def compacted(history: list, budget_chars: int | None) -> list:
    """``history`` (oldest first) cut to the newest messages within ``budget_chars``.

    The kept part starts at a user-role node (never at a tool result whose call was cut
    away) and always includes the newest message. A real request that was cut is replayed."""
    if budget_chars is None or sum(map(_size, history)) <= budget_chars:
        return history
    start, used = len(history), 0
    while start > 0 and (used + _size(history[start - 1]) <= budget_chars or start == len(history)):
        start -= 1
        used += _size(history[start])
    while start < len(history) - 1 and history[start].role != "user":
        start += 1  # begin the window at a turn boundary
    kept = history[start:]
    note = Note(f"[{start} earlier messages of this conversation were left out to fit the model's context window]")
    request = last_real_user(history)
    if request is None or any(m is request for m in kept):
        return [note, *kept]
    return [note, request, *kept]

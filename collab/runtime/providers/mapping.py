"""Transcript → model request: the shared rules, and one function per provider.

A branch's history (``TurnContext.history()``: root → tip, including what a
``start_from`` fork inherited) becomes an alternating conversation:

- ``AgentSpec.system_prompt`` is the system prompt;
- user-role nodes of every kind (prompts, tasks, messages, follow-ups, drained
  ``agent_message`` results) and system-role notices are user-role input;
  ``attach`` pointers are skipped;
- an assistant node with ``tool_calls`` is sent with its calls, and the tool
  nodes after it as their results; a call whose result is missing (a turn that
  ended between the call and its result) gets a synthetic error result, a
  result whose call is unknown becomes plain user-role text;
- consecutive user-role inputs merge into one message (Anthropic requires
  alternation; strict chat templates of OpenAI-compatible servers do too), with
  tool results first and user text after them (the mailbox
  follows all tool results, docs/contract.md#results-come-back-exactly-once);
- the request always starts and ends with user-role input, never with an
  assistant message (no prefill).

``canonical`` applies the rules once; ``openai_messages`` and
``anthropic_messages`` only change the wire shape.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

from collab.runtime.compaction import CONTEXTUAL_KINDS

EMPTY_TEXT = "(empty message)"
EMPTY_RESULT = "(empty result)"
MISSING_RESULT = "error: no result (the turn ended before this tool call finished)"
CONVERSATION_START = "(conversation start)"
CONTINUE = "Continue."

_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class Call:
    id: str
    name: str
    arguments: Any  # a dict, or what the model sent when it was not a JSON object


@dataclass
class Result:
    call_id: str
    text: str
    is_error: bool = False


@dataclass
class Turn:
    role: str  # "user" | "assistant"
    texts: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n\n".join(t for t in self.texts if t)


def safe_name(name: Any) -> str:
    """Tool names the APIs accept (``^[A-Za-z0-9_-]{1,64}$``); a malformed name is replayed sanitized."""
    name = str(name or "")
    if _NAME_OK.fullmatch(name):
        return name
    return (re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]) or "invalid_tool"


def canonical(history, *, fallback_user_text: str = CONTINUE) -> list[Turn]:
    """The branch history as alternating user/assistant turns, by the rules above."""
    turns: list[Turn] = []
    pending: list[tuple[str, str]] = []  # (original call id, wire id): the last assistant turn's unanswered calls
    used_ids: set[str] = set()

    def user_turn() -> Turn:
        if not turns or turns[-1].role != "user":
            turns.append(Turn("user"))
        return turns[-1]

    def settle_missing() -> None:
        if pending:
            target = user_turn()
            for _, wid in pending:
                target.results.append(Result(wid, MISSING_RESULT, is_error=True))
            pending.clear()

    def wire_id(original: str) -> str:
        candidate = original if _NAME_OK.fullmatch(original or "") else ""
        if not candidate or candidate in used_ids:
            n = len(used_ids)
            while f"call_{n}" in used_ids:
                n += 1
            candidate = f"call_{n}"
        used_ids.add(candidate)
        return candidate

    for message in history:
        role, kind = message.role, message.kind
        if kind == "attach":
            continue
        if role == "tool":
            original = message.tool_call_id or ""
            match = next((i for i, (orig, _) in enumerate(pending) if orig == original), None)
            if match is not None:
                meta = message.metadata or {}
                user_turn().results.append(
                    Result(pending.pop(match)[1], message.text or EMPTY_RESULT, is_error=bool(meta.get("is_error")))
                )
            else:
                tool = (message.metadata or {}).get("tool", "tool")
                user_turn().texts.append(f"[tool result: {tool}] {message.text}")
            continue
        if role == "assistant":
            settle_missing()
            calls = []
            for raw in message.tool_calls or []:
                original = str(raw.get("id") or "")
                wid = wire_id(original)
                pending.append((original, wid))
                calls.append(Call(wid, safe_name(raw.get("name")), raw.get("arguments", {})))
            if not calls and not (message.text or "").strip():
                continue
            if turns and turns[-1].role == "assistant":  # two answers in a row: one assistant message
                turns[-1].texts.append(message.text)
                turns[-1].calls.extend(calls)
            else:
                turns.append(Turn("assistant", texts=[message.text] if message.text else [], calls=calls))
            continue
        # user-role input: prompts, tasks, messages, follow-ups, drained results, system notices
        settle_missing()
        user_turn().texts.append(message.text if message.text.strip() else EMPTY_TEXT)
    settle_missing()
    if not turns or turns[0].role != "user":
        turns.insert(0, Turn("user", texts=[CONVERSATION_START]))
    if turns[-1].role != "user":
        turns.append(Turn("user", texts=[fallback_user_text or CONTINUE]))
    return turns


def _arguments_json(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments  # what the model sent, replayed as it was
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def _arguments_object(arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        return {"_invalid_json": arguments[:2000]}
    return {"_invalid_arguments": arguments}


def openai_messages(history, system_prompt: str = "", *, fallback_user_text: str = CONTINUE) -> list[dict]:
    """Chat Completions ``messages``: system, then the canonical turns (tool results as
    ``role: "tool"`` messages with ``tool_call_id``, before that turn's user text)."""
    out: list[dict] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for turn in canonical(history, fallback_user_text=fallback_user_text):
        if turn.role == "user":
            for result in turn.results:
                out.append({"role": "tool", "tool_call_id": result.call_id, "content": result.text})
            if turn.texts:
                out.append({"role": "user", "content": turn.text})
            continue
        # "" rather than null beside tool calls: llama.cpp's server refuses a null content
        message: dict = {"role": "assistant", "content": turn.text or ""}
        if turn.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments_json(c.arguments)}}
                for c in turn.calls
            ]
        out.append(message)
    return out


def anthropic_messages(history, *, fallback_user_text: str = CONTINUE) -> list[dict]:
    """Messages API ``messages`` (the system prompt is a separate parameter): user turns
    carry ``tool_result`` blocks first, then text; assistant turns text, then ``tool_use``."""
    out: list[dict] = []
    for turn in canonical(history, fallback_user_text=fallback_user_text):
        content: list[dict] = []
        if turn.role == "user":
            for result in turn.results:
                block = {"type": "tool_result", "tool_use_id": result.call_id, "content": result.text}
                if result.is_error:
                    block["is_error"] = True
                content.append(block)
            if turn.texts:
                content.append({"type": "text", "text": turn.text})
        else:
            if turn.text.strip():
                content.append({"type": "text", "text": turn.text})
            for c in turn.calls:
                content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": _arguments_object(c.arguments)})
        out.append({"role": turn.role, "content": content})
    return out


def openai_tools(tools) -> list[dict]:
    """Function tools from the registry: the tool's own JSON Schema is the one source."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.json_schema()}}
        for t in tools
    ]


def anthropic_tools(tools) -> list[dict]:
    return [{"name": t.name, "description": t.description, "input_schema": t.json_schema()} for t in tools]


def parse_arguments(raw: Any) -> Any:
    """A model's tool-call arguments as sent to ``run_tool``: the parsed JSON object, or, when
    they are not valid JSON, a ``MalformedArguments`` string (``run_tool`` answers
    ``invalid_arguments`` and the model sees why). Empty arguments are ``{}``."""
    if isinstance(raw, dict):
        return raw
    if raw is None:
        return {}
    text = str(raw)
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError as exc:
        return MalformedArguments(text, f"arguments are not valid JSON ({exc})")


class MalformedArguments(str):
    """The raw arguments text a model sent that did not parse; ``problem`` says why."""

    problem: str

    def __new__(cls, text: str, problem: str):
        value = super().__new__(cls, text)
        value.problem = problem
        return value


TITLE_SYSTEM = (
    "You name conversations. Reply with only a short title for the conversation below: "
    "at most 8 words, no quotes, no trailing punctuation."
)
TITLE_MAX_WORDS = 8
TITLE_INPUT_CHARS = 4000


def title_request(messages) -> str:
    """The conversation excerpt a title is asked for: user and assistant text, headers skipped."""
    lines = []
    for m in messages:
        # delivered results and notices are context, not the conversation a title describes
        if m.kind in CONTEXTUAL_KINDS or m.role == "tool" or not (m.text or "").strip():
            continue
        text = m.text
        header = (m.metadata or {}).get("header") or ""
        if header and text.startswith(header):
            text = text[len(header):].strip()
        lines.append(f"{m.role}: {text}")
    body = "\n\n".join(lines)
    return body[:TITLE_INPUT_CHARS] or "(empty conversation)"


def clean_title(text: str) -> str:
    """First line of the model's answer, unquoted, at most 8 words."""
    line = next((ln for ln in (text or "").splitlines() if ln.strip()), "")
    line = re.sub(r"^(title\s*:\s*)", "", line.strip(), flags=re.I)
    line = line.strip().strip("\"'`*#").strip()
    words = line.split()[:TITLE_MAX_WORDS]
    return " ".join(words).rstrip(".!?,;:")[:100]

"""Reading a branch's history without re-serializing it."""

import json

from django.db import connection

from collab.models import Message

_CHAIN_SQL = """
WITH RECURSIVE chain(id, predecessor_id, n) AS (
    SELECT id, predecessor_id, 1 FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, c.n + 1 FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE %s = 0 OR c.n < %s
)
SELECT id FROM chain
"""


def lineage_ids(tip_id: str, limit: int = 0) -> list[str]:
    """Ids from ``tip_id`` back towards the root (newest first), at most ``limit`` (0 = all)."""
    with connection.cursor() as cursor:
        cursor.execute(_CHAIN_SQL, [tip_id, limit, limit])
        return [row[0] for row in cursor.fetchall()]


def lineage(tip: Message | None, limit: int = 0) -> list[Message]:
    """The messages from the root (or the last ``limit``) to ``tip``, oldest first."""
    if tip is None:
        return []
    ids = lineage_ids(tip.pk, limit)
    return list(Message.objects.filter(pk__in=ids).order_by("depth"))


_WINDOW_SQL = """
WITH RECURSIVE chain(id, predecessor_id, turn) AS (
    SELECT id, predecessor_id, turn FROM collab_message WHERE id = %s
    UNION ALL
    SELECT m.id, m.predecessor_id, m.turn FROM collab_message m JOIN chain c ON m.id = c.predecessor_id
    WHERE c.turn >= %s
)
SELECT id FROM chain WHERE turn >= %s
"""


def lineage_from_turn(tip: Message, min_turn: int) -> list[Message]:
    """The lineage of ``tip`` restricted to turns ``>= min_turn``, oldest first.

    Walks back only as far as the window needs, so reading the last turns of a
    100k-message branch costs about what it costs on a short one.
    """
    with connection.cursor() as cursor:
        cursor.execute(_WINDOW_SQL, [tip.pk, min_turn, min_turn])
        ids = [row[0] for row in cursor.fetchall()]
    return list(Message.objects.filter(pk__in=ids).order_by("depth"))


DEFAULT_MAX_CHARS = 60_000
MIN_MAX_CHARS = 100
MAX_MAX_CHARS = 200_000  # read_conversation and the transcript route clamp max_chars to this range
TOOL_RESULT_CHARS = 4_000


def _render_message(m: Message, include_function_calls: bool) -> str | None:
    if m.kind == "attach":
        return None
    if m.role == "tool":
        if not include_function_calls:
            return None
        tool = (m.metadata or {}).get("tool", "tool")
        text = m.text if len(m.text) <= TOOL_RESULT_CHARS else m.text[:TOOL_RESULT_CHARS] + " […]"
        return f"[tool result: {tool}] {text}"
    if m.role == "assistant" and m.tool_calls:
        if not include_function_calls:
            return f"[assistant] {m.text}" if m.text else None
        calls = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments', {}), ensure_ascii=False)})" for c in m.tool_calls)
        return f"[assistant] {m.text + ' ' if m.text else ''}→ {calls}"
    label = m.role if m.kind in ("normal",) else f"{m.role}:{m.kind}"
    return f"[{label}] {m.text}"


def render_transcript(branch, *, viewer, start_turn: int = 0, end_turn: int | None = None,
                      include_function_calls: bool = True, max_chars: int = DEFAULT_MAX_CHARS) -> dict:
    """``read_conversation``'s rendering (OP tool page §06 scene 3). Turns are numbered from 0;
    negative bounds count from the end; later turns beyond ``max_chars`` are dropped. A session
    ``viewer`` may not see, named in a message (a prompt's "[task from SID:MSG]" header, a
    result's source, a tool call), reads "another session" (issue 17)."""
    from collab.selectors.redact import redact_messages

    tip = branch.tip
    total = tip.turn if tip else 0
    indices = range(total)[slice(start_turn, end_turn)]
    base = {"session_id": branch.session_id, "branch": branch.pk, "name": branch.display_name,
            "address": branch.address, "archived": branch.archived, "total_turns": total}
    if not indices:
        return {**base, "text": f"(no turns in range; the branch has {total} turns)", "turns": [], "omitted_turns": 0}
    first, last = indices[0], indices[-1]
    messages = [m for m in lineage_from_turn(tip, first + 1) if m.turn <= last + 1]
    redact_messages(viewer, branch.session_id, messages)
    by_turn: dict[int, list[Message]] = {}
    for m in messages:
        by_turn.setdefault(m.turn - 1, []).append(m)
    parts, turns, used, omitted = [], [], 0, 0
    for index in indices:
        lines = [line for m in by_turn.get(index, []) if (line := _render_message(m, include_function_calls))]
        block = f"## turn {index}\n" + "\n".join(lines)
        if parts and used + len(block) > max_chars:
            omitted = len(indices) - len(turns)
            break
        if not parts and len(block) > max_chars:
            block = block[:max_chars] + " […]"
        parts.append(block)
        used += len(block) + 2
        turns.append({"index": index, "messages": [
            {"id": m.pk, "role": m.role, "kind": m.kind, "text": m.text, "tool_calls": m.tool_calls,
             "tool": (m.metadata or {}).get("tool")}
            for m in by_turn.get(index, []) if m.kind != "attach"
        ]})
    text = "\n\n".join(parts)
    if omitted:
        text += f"\n\n[{omitted} later turns omitted by max_chars={max_chars}; read on with start_turn={turns[-1]['index'] + 1}]"
    return {**base, "text": text, "turns": turns, "omitted_turns": omitted}

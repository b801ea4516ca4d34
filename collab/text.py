"""The one boundary for untrusted text (docs/contract.md#results, its last paragraph).

PostgreSQL cannot store NUL (``\\x00``) in text or jsonb, nor a lone UTF-16 surrogate
(``\\ud800``–``\\udfff``: what ``json.loads`` makes of an unpaired ``"\\ud800"`` and what
Python makes of a non-UTF-8 file name); SQLite stores both. So every text that is stored
— prompts, tool arguments and results, model output, titles, names, event payloads,
artifacts, form fields and query strings — passes ``clean_text`` (or ``clean_data`` for
JSON-shaped values) first: each such character becomes U+FFFD, visibly, and the two
databases hold the same thing. Lengths are checked by the callers before the database
is asked.
"""

import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator

REPLACEMENT = "\ufffd"

# What ``str.strip()`` removes (``str.isspace``), as a regex class that reads the same in every
# engine a published schema meets: ``\s`` does not (ECMA's and Rust's leave out U+001C–U+001F
# and U+0085, and add U+FEFF).
WHITESPACE = "[\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
NOT_WHITESPACE = "[^" + WHITESPACE[1:]
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(value: str) -> str:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (anything not a str is returned as is)."""
    if not isinstance(value, str) or not _UNSTORABLE.search(value):
        return value
    return _UNSTORABLE.sub(REPLACEMENT, value)


def clean_data(value: Any) -> Any:
    """A JSON-shaped value (dicts, lists, tuples, strings, numbers) with every string — keys
    included — passed through ``clean_text``, and a non-finite float (``Infinity``/``NaN``,
    which PostgreSQL's jsonb refuses and SQLite stores) written as its name, a string.
    Other values are returned as they are."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: clean_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(clean_data(v) for v in value)
    return value


def fit_text(value: str, max_length: int) -> str:
    """Cleaned ``value`` cut to ``max_length`` characters: for names derived from untrusted
    text (a prompt's label, a model's title) that must fit a column rather than be refused."""
    return clean_text(value or "")[:max_length]


# --- bounded text: the one head+tail rule (docs/contract.md#results) ---------------------------
# A text too long for its reader keeps its head (two thirds) and its tail (one third) around a
# marker saying how much was left out, the whole within the bound: tool results, job_output,
# delivered results and the API (30,000 characters, less for a small context window), a bash
# command's output as it streams, an event's copy of a long message.

RESULT_LIMIT = 30_000
OMISSION_MARKER = "\n\n[… {omitted} characters omitted …]\n\n"


def _head_tail(total: int, limit: int) -> tuple[int, int]:
    """How many characters of a ``total``-long text to keep at its head and at its tail so
    that they and the marker fit in ``limit``."""
    keep = max(limit - len(OMISSION_MARKER.format(omitted=total)), 0)
    head = keep * 2 // 3
    return head, keep - head


def _joined(head: str, tail: str, total: int, limit: int) -> str:
    h, t = _head_tail(total, limit)
    return head[:h] + OMISSION_MARKER.format(omitted=total - h - t) + (tail[-t:] if t else "")


def bound_text(text: str, limit: int = RESULT_LIMIT) -> tuple[str, bool]:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker
    (the whole stays within ``limit``). Returns ``(summary, truncated)``."""
    if len(text) <= limit:
        return text, False
    return _joined(text, text, len(text), limit), True


class BoundedStream:
    """``bound_text`` for text that arrives in pieces (a command's output): keeps only what the
    bound can show — the first and the last ``limit`` characters — however much arrives."""

    def __init__(self, limit: int = RESULT_LIMIT):
        self.limit = limit
        self.head = ""
        self.tail = ""
        self.total = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        if len(self.head) < self.limit:
            room = self.limit - len(self.head)
            self.head += text[:room]
        self.tail = (self.tail + text)[-self.limit:]

    def text(self) -> str:
        if self.total <= self.limit:
            return self.head
        return _joined(self.head, self.tail, self.total, self.limit)


# A pydantic str that is cleaned on the way in (API schemas, tool parameters).
CleanStr = Annotated[str, AfterValidator(clean_text)]


MAX_JSON_DEPTH = 64  # arrays and objects nested in a request body or a socket frame


def loads_bounded(raw: str | bytes, *, max_chars: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON from outside (an MCP request, a socket frame), refused before parsing when it is too
    long or nested too deep — the parser would otherwise recurse until Python's own limit and fail
    with an error no caller expects. ``NaN``, ``Infinity`` and numbers out of a float's range are
    refused as the API refuses them. Raises ``ValueError`` saying which; ``json.loads``'s own
    errors are ``ValueError`` too."""
    if isinstance(raw, bytes):
        if len(raw) > max_chars:
            raise ValueError(f"longer than {max_chars} bytes")
        raw = raw.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if len(raw) > max_chars:
        raise ValueError(f"longer than {max_chars} characters")
    depth, in_string, escaped = 0, False, False
    for ch in raw:  # the nesting outside strings, without recursion
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise ValueError(f"nested deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:40]} is out of range")
    return value

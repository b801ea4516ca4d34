"""The one boundary for untrusted text (STYLE §13, SPEC §8, P-TXT-1).

PostgreSQL cannot store NUL (``\\x00``) in text or jsonb, nor a lone UTF-16 surrogate
(``\\ud800``–``\\udfff``: what ``json.loads`` makes of an unpaired ``"\\ud800"`` and what
Python makes of a non-UTF-8 file name); SQLite stores both. So every text that is stored
— prompts, tool arguments and results, model output, titles, names, event payloads,
artifacts, form fields and query strings — passes ``clean_text`` (or ``clean_data`` for
JSON-shaped values) first: each such character becomes U+FFFD, visibly, and the two
databases hold the same thing. Lengths are checked by the callers before the database
is asked.
"""

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator

REPLACEMENT = "\ufffd"
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


# A pydantic str that is cleaned on the way in (API schemas, tool parameters).
CleanStr = Annotated[str, AfterValidator(clean_text)]

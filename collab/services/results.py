"""How much of a result a model may read (docs/contract.md#results): tool results, job_output, inline follow-ups
and API answers are all cut by ``collab.text.bound_text`` to ``result_limit_for`` the reader."""

from collab.text import RESULT_LIMIT

CHARS_PER_TOKEN = 4  # the estimate used wherever a size in tokens is needed without a tokenizer
MIN_RESULT_LIMIT = 2_000


def estimate_tokens(text: str) -> int:
    """About how many tokens ``text`` is (~4 characters a token, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def result_limit_for(spec) -> int:
    """The bound for results a model reads: 30,000 characters, lower when the spec declares a
    small context window (``limits.context_window`` in tokens): a result may take about a
    quarter of it (~4 characters a token), never less than 2,000 characters."""
    window = (getattr(spec, "limits", None) or {}).get("context_window") if spec is not None else None
    try:
        window = int(window)
    except (TypeError, ValueError):
        return RESULT_LIMIT
    if window <= 0:
        return RESULT_LIMIT
    return max(MIN_RESULT_LIMIT, min(RESULT_LIMIT, window))

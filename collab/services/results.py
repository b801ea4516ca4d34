"""The one bounded summary of a result (SPEC §9): tool results, job_output,
inline follow-ups and API answers all go through ``bound_text``."""

RESULT_LIMIT = 30_000
CHARS_PER_TOKEN = 4  # the estimate used wherever a size in tokens is needed without a tokenizer
MIN_RESULT_LIMIT = 2_000
MARKER = "\n\n[… {omitted} characters omitted …]\n\n"


def bound_text(text: str, limit: int = RESULT_LIMIT) -> tuple[str, bool]:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker
    (the whole stays within ``limit``). Returns ``(summary, truncated)``."""
    if len(text) <= limit:
        return text, False
    marker_room = len(MARKER.format(omitted=len(text)))
    keep = max(limit - marker_room, 0)
    head = keep * 2 // 3
    tail = keep - head
    omitted = len(text) - head - tail
    return text[:head] + MARKER.format(omitted=omitted) + (text[-tail:] if tail else ""), True


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

"""The formats of a delivered result (docs/contract.md#results-come-back-exactly-once and
#the-openwork-toolset).

``collab.services.followup`` writes a finished job's result into its caller's branch in one of
two formats, and ``collab.selectors.transcript`` reads them back for pages; both take the
formats from here, so the writer and the reader cannot drift apart and the selector does not
import a service. Pure text, no rows.
"""

import re

from collab.models.branches import NO_ADDRESS

# the body of an OpenWork <agent_message> envelope in the cases that carry no result text
INTERRUPTED_LIVE = "Sub-agent turn was interrupted."
INTERRUPTED_RESTART = (
    "Sub-agent was interrupted by a process restart and is no longer available. "
    "Spawn a new explorer if this result is still needed."
)
CANCELLED_RECONCILED = "cancelled: Sub-agent turn was cancelled."
EMPTY_FINAL = "Sub-agent completed without a persisted final response."

_ENVELOPE_OPEN = "<body>\n"
_ENVELOPE_CLOSE = "\n</body>\n</agent_message>"


def notice_lead(source: str | None, who: str, job_id, status: str | None) -> str:
    """The lead of a result notice: where the result comes from (its ``SID:HEAD``, None for a
    branch with no message) and how the job ended (for the model); ``status`` None for a job that
    succeeded, otherwise the status it ended in."""
    source = source or NO_ADDRESS
    if status is None:
        return f"[result from {source}]\nAgent {who!r} finished execution {job_id}:\n\n"
    return f"[result from {source}]\nAgent {who!r} did not finish execution {job_id}: {status} (is_error=true): "


def agent_message(task_name: str, kind: str, body: str) -> str:
    """The OpenWork ``<agent_message>`` envelope of a child's finished turn."""
    return f"<agent_message>\n<task>{task_name}</task>\n<kind>{kind}</kind>\n{_ENVELOPE_OPEN}{body}{_ENVELOPE_CLOSE}"


def envelope_span(text: str) -> list[int]:
    """Where the body of an ``agent_message`` text starts and ends."""
    start = text.index(_ENVELOPE_OPEN) + len(_ENVELOPE_OPEN)
    return [start, len(text) - len(_ENVELOPE_CLOSE)]


_NOTICE_LEAD = re.compile(
    r"\[result from (?P<source>[^\]\s]*)\]\nAgent .*? (?:finished execution \S+:\n\n"
    r"|did not finish execution \S+: \S+ \(is_error=true\): )", re.DOTALL)
_ENVELOPE = re.compile(r"<agent_message>\n<task>[^<]*</task>\n<kind>[^<]*</kind>\n<body>\n(?P<body>.*)\n</body>\n</agent_message>\Z", re.DOTALL)


def split_delivery(text: str) -> tuple[str, str] | None:
    """(source address or "", body) of a delivered result written without a ``body`` span in its
    metadata (follow-up prompts, and rows written before the span was recorded); None when
    ``text`` is in neither of the formats above. The formats are made here, so they are read here."""
    if (m := _ENVELOPE.match(text)) is not None:
        return "", m.group("body")
    if (m := _NOTICE_LEAD.match(text)) is not None:
        return m.group("source"), text[m.end():]
    return None

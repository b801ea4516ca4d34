"""How a turn ends when it does not answer: the one failure path.

Whatever stops a turn — a cancel, a project limit, the tool-call cap, a provider error, a crash,
a branch archived before the turn started — is turned into a ``Failure`` by ``failure_of`` and
ended by ``end_failed``; a new kind of failure is one more case in ``failure_of``.
"""

import logging
from dataclasses import dataclass

from collab.models import JobStatus
from collab.runtime.providers import ProviderError
from collab.services.execution import finish_job

log = logging.getLogger(__name__)


class TurnStopped(Exception):
    """The job was asked to stop (cancel); the loop unwinds and the job ends cancelled."""


class LimitExceeded(Exception):
    """A limit (the project's tokens, cost, runtime or idle time; the turn's model or tool
    calls; a doom loop) ended the turn: ``code`` is its error code."""

    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class ToolCallLimit(LimitExceeded):
    """The turn asked for more tool calls than ``TRELLIS_MAX_TOOL_CALLS``."""

    def __init__(self, reason: str):
        super().__init__("tool_call_limit", reason)


@dataclass(frozen=True)
class Failure:
    """How a job that did not answer ends: its status, error code and reason, and the result
    text its caller reads (the reason, unless said otherwise)."""

    status: str
    code: str
    reason: str
    result_text: str = ""

    @property
    def result(self) -> str:
        return self.result_text or self.reason


CANCELLED = Failure(JobStatus.CANCELLED, "cancelled", "the execution was cancelled", result_text="cancelled")


def failure_of(exc: BaseException, job_id: str = "") -> Failure:
    """The failure an exception that ended turn ``job_id`` stands for. Anything unforeseen is an
    ``internal_error`` (logged with its traceback), never a job left running."""
    if isinstance(exc, TurnStopped):
        return CANCELLED
    if isinstance(exc, (LimitExceeded, ProviderError)):
        return Failure(JobStatus.FAILED, exc.code, exc.reason)
    log.error("turn %s crashed", job_id, exc_info=exc)
    return Failure(JobStatus.FAILED, "internal_error", f"internal error: {type(exc).__name__}")


def archived_before_start(job) -> Failure:
    """A delivery accepted before its branch was archived and started after: refused, with the reason on record."""
    return Failure(JobStatus.FAILED, "archived",
                   f"agent {job.branch.display_name!r} was archived before this delivery started")


def unstorable_answer(exc: BaseException, job_id: str) -> Failure:
    """The final answer could not be stored: the job still ends, never stays running."""
    log.error("turn %s could not store its answer", job_id, exc_info=exc)
    return Failure(JobStatus.FAILED, "internal_error",
                   f"internal error: the final answer could not be stored ({type(exc).__name__})")


def end_failed(job, failure: Failure, usage: dict | None = None) -> None:
    """End ``job`` as ``failure`` says, in one completion transaction (``finish_job``)."""
    finish_job(job, status=failure.status, final_text=None, result_text=failure.result, is_error=True,
               error_code=failure.code, error_reason=failure.reason, usage=usage)

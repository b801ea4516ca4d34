"""A streaming model's text as it is generated: fragments are batched into
``message.delta`` events — about four a second, or every 400 characters — never one per token."""

import time

from django.db import transaction

from collab.events import send_event_on_commit
from collab.services.waiting import idle_connection

DELTA_FLUSH_SECONDS = 0.25
DELTA_FLUSH_CHARS = 400


class DeltaBatcher:
    """The fragments of one job's model call not yet sent."""

    def __init__(self, session_id: str, job_id: str, branch_id: str):
        self.session_id = session_id
        self.job_id = job_id
        self.branch_id = branch_id
        self.pending: list[str] = []
        self.flushed_at = 0.0

    def add(self, text: str, call: int) -> None:
        """A fragment of model call number ``call``: sent when enough time or text has gathered."""
        self.pending.append(text)
        now = time.monotonic()
        if now - self.flushed_at >= DELTA_FLUSH_SECONDS or sum(map(len, self.pending)) >= DELTA_FLUSH_CHARS:
            self.flush(call)

    def flush(self, call: int) -> None:
        """Send what has gathered (after every model call, so nothing is left behind)."""
        if not self.pending:
            return
        chunk, self.pending = "".join(self.pending), []
        self.flushed_at = time.monotonic()
        with transaction.atomic():
            send_event_on_commit(
                self.session_id, "message.delta",
                {"job": self.job_id, "branch": self.branch_id, "call": call, "text": chunk},
            )
        idle_connection()  # the model call goes on: its connection goes back to the pool between flushes

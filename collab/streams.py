"""One execution as Server-Sent Events: ``GET /api/executions/{id}/stream``.

For clients that do not speak WebSocket. The frames are the execution's events from its
session's log — status changes (``job.*``), message deltas (``message.delta``), the messages it
wrote (``message.created``: tool calls, tool results, the final answer) — as the events API
shows them to this viewer (redacted), one frame each::

    id: <seq>
    event: <type>
    data: {"seq": …, "type": …, "payload": {…}, "created_at": …}

First the logged ones after ``Last-Event-ID`` (or ``?after=``), then live, in ``seq`` order;
after the execution's terminal event (``job.succeeded`` / ``failed`` / ``cancelled`` /
``interrupted``) one ``event: end`` frame and the stream closes. A comment line
(``: keep-alive``) every ``SSE_HEARTBEAT_SECONDS`` (``collab.realtime.bounds``). Same authentication, token scope (``read``)
and authorization as ``GET /api/executions/{id}``.

No thread is busy per open stream: the view is async and the body an async iterator that
daphne drains on its event loop (the request's own sync thread, ``collab.infra.request_threads``,
stays reserved for the stream's reads, idle between them). It listens on a subscription to the
session (``collab.realtime.subscription``: its channel-layer group, poked by this process's
database relay on the embedded default) and reads the log only when something about this
session arrived (or at each heartbeat, as a safety net).
"""

import asyncio
import json
import weakref
from typing import Annotated

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Router

from collab import access
from collab.api import ERRORS
from collab.errors import Invalid
from collab.models import TERMINAL_STATUSES, Session
from collab.realtime.bounds import SSE_HEARTBEAT_SECONDS, open_wait
from collab.realtime.push import pushed_wires
from collab.realtime.subscription import Subscription
from collab.schemas import stated
from collab.text import WHITESPACE
from collab.scopes import request_token
from collab.selectors.events import PAGE, events_after
from collab.selectors.jobs import job_status
from collab.selectors.redact import Memo

router = Router()

TERMINAL_TYPES = frozenset(f"job.{status}" for status in TERMINAL_STATUSES)


def _resume_point(last_event_id: str | None, after: str | None) -> int:
    """The seq to resume after: ``Last-Event-ID`` (what an EventSource sends on reconnect), else
    ``?after=``, else 0. Not a non-negative integer → 400."""
    name, raw = ("Last-Event-ID", last_event_id) if last_event_id is not None else ("after", after)
    if raw is None or raw.strip() == "":
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise Invalid(f"{name} must be an event seq (a non-negative integer), not {raw[:40]!r}",
                      code="invalid_last_event_id")
    return value


# What ``_resume_point`` reads as a seq (``int()`` of the stripped text: digits, "_" between
# them, a "+"; "-0" is 0), or blank for "from the start". Digits 0-9: ``int()`` also reads
# other scripts' digits, which ``\d`` means in some engines and not in others. A header is a
# string or absent, never null: its schema is the string's alone.
SEQ_TEXT = stated({"type": "string",
                   "pattern": f"^{WHITESPACE}*(?:\\+?[0-9]+(?:_[0-9]+)*|-0+(?:_0+)*)?{WHITESPACE}*$"})


# One event of the stream, as SSE clients (and schemathesis) parse it: ``id`` (the event's seq;
# none on the closing ``end``), ``event`` (its type, or ``end``) and ``data`` (the event as JSON).
SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["event", "data"],
}


@router.get("executions/{execution_id}/stream", response={200: None, **ERRORS}, tags=["executions"],
            openapi_extra={"responses": {200: {"description": "Server-Sent Events (text/event-stream)",
                                               "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}}}}})
async def stream_execution(request: HttpRequest, execution_id: str, after: Annotated[str, SEQ_TEXT] | None = None,
                           last_event_id: Annotated[str | None, SEQ_TEXT] = Header(None, alias="Last-Event-ID")):
    """The execution's events as Server-Sent Events, resumable with ``Last-Event-ID``
    (= event seq) or ``?after=SEQ``; ends with ``event: end`` after its terminal event."""
    job = await sync_to_async(access.access_job)(request.auth, execution_id)
    start = _resume_point(last_event_id, after)
    token = request_token(request)
    slot = open_wait(request.auth)  # 429 too_many_open_waits past the user's bound; freed when the stream ends
    frames = _frames(request.auth, getattr(token, "pk", None), job.pk, job.session_id, start, slot)
    weakref.finalize(frames, slot.free)  # a body never started (the client left first) frees it too
    response = StreamingHttpResponse(frames, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _frame(wire: dict) -> str:
    return f"id: {wire['seq']}\nevent: {wire['type']}\ndata: {json.dumps(wire, separators=(',', ':'))}\n\n"


def _end(job_id: str, status: str) -> str:
    return f"event: end\ndata: {json.dumps({'execution_id': job_id, 'status': status})}\n\n"


@database_sync_to_async
def _read(viewer, session_id: str, job_id: str, after: int, memo: Memo) -> tuple[list[dict], int, str | None]:
    """(this job's events after ``after`` as the viewer sees them, the session seq read through,
    the job's status if it had ended before the read — then every event of its is in the log)."""
    status = job_status(job_id)
    through = Session.objects.filter(pk=session_id).values_list("last_event_seq", flat=True).first() or 0
    wires = events_after(session_id, after, PAGE, viewer=viewer, memo=memo, job=job_id)
    if len(wires) == PAGE:  # more to read: only through the last one
        return wires, wires[-1]["seq"], None
    through = max([through, after] + [w["seq"] for w in wires])
    return wires, through, status if status in TERMINAL_STATUSES else None


_still_reads_job = database_sync_to_async(access.still_reads_job)


def _unread(wires: list[dict], last: int, job_id: str) -> tuple[int, bool]:
    """Pushed events against the stream's position ``last``: the new position, and whether the log
    must be read (an event about the job, or a gap). Events already read and the next ones about
    something else only move the position."""
    for wire in wires:
        seq = wire.get("seq")
        if not isinstance(seq, int) or seq <= last:
            continue  # already read
        if seq == last + 1 and (wire.get("payload") or {}).get("job") != job_id:
            last = seq  # the next event, about something else: nothing to read
            continue
        return last, True
    return last, False


async def _frames(viewer, token_id: int | None, job_id: str, session_id: str, after: int, slot=None):
    """The stream's frames; ``slot`` (the viewer's open-wait slot) is freed when it ends."""
    subscription = await Subscription.open(session_id)
    memo = Memo()
    last = after
    try:
        while True:
            wires, through, ended = await _read(viewer, session_id, job_id, last, memo)
            for wire in wires:
                yield _frame(wire)
                if wire["type"] in TERMINAL_TYPES:
                    yield _end(job_id, wire["type"].removeprefix("job."))
                    return
            last = through
            if ended:
                yield _end(job_id, ended)
                return
            while True:  # until something about this session arrived (or a heartbeat is due)
                if not subscription.listening:  # no channel layer: read the log on a timer
                    await asyncio.sleep(settings.TRELLIS_EVENT_POLL_INTERVAL)
                    break
                message = await subscription.next(SSE_HEARTBEAT_SECONDS)
                if message is None:  # a heartbeat is due (or the layer read failed: read the log again)
                    if not await _still_reads_job(viewer, token_id, job_id):
                        return  # revoked token, or the job no longer visible: close, say nothing more
                    yield ": keep-alive\n\n"
                    break
                if message.get("type") == "collab.event":
                    last, read = _unread(pushed_wires(message), last, job_id)
                    if not read:
                        continue
                if message.get("type") == "collab.poke" and message.get("seq", 0) <= last:
                    continue
                break
    finally:
        await subscription.close()
        if slot is not None:
            slot.free()

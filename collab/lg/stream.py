"""A run's output as LangGraph's clients read it (docs/langgraph.md#streaming): its status, the
JSON of ``runs.wait`` / ``runs.join``, and its Server-Sent Events.

A *run* is one stretch of an execution's life: from its admission (or the decision that
resumed it) to its end — terminal, or ``waiting`` for a person, which LangGraph calls an
interrupted run. Its frames are made from the execution's events in the session's log
(``collab.selectors.events.events_after`` with ``job``), each event giving the same frames
whenever it is read, so a stream resumed with ``Last-Event-ID`` carries on exactly where the
dropped one stopped (no frame missed, none repeated):

- ``message.created`` of a message the run wrote: ``messages`` (``stream_mode="messages-tuple"``:
  ``[message, metadata]`` for an ai or tool message), ``updates`` (``{node: {"messages":
  [message]}}``, not for the run's own input) and ``values`` (the thread's messages up to that
  message), in that order;
- ``message.delta`` (a streaming model's text): ``messages`` with an ``AIMessageChunk``;
- ``approval.requested`` / ``question.asked``: ``updates`` ``{"__interrupt__": [...]}`` and
  ``values`` with ``__interrupt__``;
- the run's end: ``error`` (``{"error", "message"}``) when it failed, then ``end``.

Each frame's ``id`` is ``<seq>-<n>``: the n-th frame of the event numbered ``seq``; the opening
``metadata`` frame's is the seq the stream starts after. The streams hold no thread while they
wait (``collab.realtime.subscription``, as ``collab.streams``)."""

import asyncio
import json
import re
from dataclasses import dataclass

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest

from collab import access
from collab.errors import Invalid
from collab.lg import values
from collab.models import TERMINAL_STATUSES, Event, Job, JobStatus, Message, MessageRole, PersonAsk, Session
from collab.realtime.bounds import SSE_HEARTBEAT_SECONDS
from collab.realtime.push import pushed_wires
from collab.realtime.subscription import Subscription
from collab.realtime.threads import briefly, in_thread
from collab.selectors.events import PAGE, events_after
from collab.selectors.redact import Memo

VALUES, UPDATES, MESSAGES, CUSTOM = "values", "updates", "messages-tuple", "custom"
STREAM_MODES = (VALUES, UPDATES, MESSAGES)  # what a stream without stream_mode carries
# ``custom``: what a graph's own code writes to the stream. A Trellis agent writes none, so it
# adds no frame; it is accepted because clients ask for it whenever they listen for it (useStream
# with ``onCustomEvent``, as Agent Chat UI does).
ACCEPTED_MODES = (*STREAM_MODES, CUSTOM)
TOOLS_NODE = "tools"  # the node a tool result comes from (an agent's turn is ``values.AGENT_NODE``)

# a run is over when its execution ended or waits for a person
DONE_STATUSES = (*TERMINAL_STATUSES, JobStatus.WAITING)
ASK_EVENTS = ("approval.requested", "question.asked")
TIMEOUT_CODES = ("quota.runtime_exceeded", "quota.idle_exceeded")

# LangGraph's run statuses (langgraph_sdk.schema.RunStatus) of an execution's
PENDING, RUNNING, SUCCESS, ERROR, TIMEOUT, INTERRUPTED = "pending", "running", "success", "error", "timeout", "interrupted"
RUN_STATUS = {
    JobStatus.QUEUED: PENDING,
    JobStatus.RUNNING: RUNNING,
    JobStatus.STOPPING: RUNNING,
    JobStatus.WAITING: INTERRUPTED,  # waits for a person: LangGraph's interrupted run
    JobStatus.SUCCEEDED: SUCCESS,
    JobStatus.FAILED: ERROR,
    JobStatus.CANCELLED: INTERRUPTED,  # cancelled: LangGraph's cancel with action "interrupt"
    JobStatus.INTERRUPTED: ERROR,  # its worker was lost (docs/contract.md#crash-recovery)
}


def run_status(status: str, error_code: str = "") -> str:
    """The LangGraph status of an execution's ``status`` (a failure past the project's clock
    limits is a ``timeout``)."""
    if status == JobStatus.FAILED and error_code in TIMEOUT_CODES:
        return TIMEOUT
    return RUN_STATUS.get(status, ERROR)


def run_error(job: Job) -> dict | None:
    """What a run that failed says (LangGraph's ``{"error", "message"}``), else None."""
    if job.status not in (JobStatus.FAILED, JobStatus.INTERRUPTED):
        return None
    return {"error": job.error_code or job.status, "message": job.error_reason or f"the run {job.status}"}


def last_message(job: Job, *, until=None) -> Message | None:
    """The latest message ``job`` wrote on its branch (``until``: written by then)."""
    messages = Message.objects.filter(job_id=job.pk, branch_id=job.branch_id)
    if until is not None:
        messages = messages.filter(created_at__lte=until)
    return messages.order_by("-depth").first()


def run_output(viewer, job: Job) -> dict:
    """The body of ``runs.wait`` and ``runs.join``: the thread's values where the run left them
    (its last message; before it wrote any, where it was admitted), with the interrupts it waits on
    as ``__interrupt__``; a failed run's is LangGraph's ``{"__error__": {"error", "message"}}``."""
    error = run_error(job)
    if error is not None:
        return {"__error__": error}
    session = job.session
    tip = last_message(job) or (Message.objects.filter(pk=job.parent_msg_id).first() if job.parent_msg_id else None)
    output = values.thread_values(viewer, session, tip=tip) if tip is not None else {"messages": []}
    if job.status == JobStatus.WAITING:
        output["__interrupt__"] = [i for i in values.interrupts_of(viewer, session)
                                   if i["value"]["trellis"]["run_id"] == job.pk]
    return output


# --- where a stream starts --------------------------------------------------------------------


@dataclass(frozen=True)
class Position:
    """How far a stream has gone: through event ``seq`` — all of its frames, or (``frame``) only
    those up to that index."""

    seq: int
    frame: int | None = None

    @property
    def read_after(self) -> int:
        return self.seq if self.frame is None else self.seq - 1

    @property
    def last_event_id(self) -> str:
        return str(self.seq) if self.frame is None else f"{self.seq}-{self.frame}"


FROM_RUN_START = "-1"  # a Last-Event-ID asking for the whole run (as LangGraph's resumable streams take it)
_EVENT_ID = re.compile(r"(\d{1,18})(?:-(\d{1,6}))?")


def parse_last_event_id(raw: str | None) -> Position | None:
    """A ``Last-Event-ID`` as the stream wrote it (``<seq>-<n>``, or the ``metadata`` frame's
    ``<seq>``); None when absent; ``FROM_RUN_START`` is the caller's. Anything else → 400."""
    if raw is None or raw.strip() == "":
        return None
    match = _EVENT_ID.fullmatch(raw.strip())
    if match is None:
        raise Invalid(f"Last-Event-ID must be an id this stream sent (<seq>-<n>), not {raw[:40]!r}",
                      code="invalid_last_event_id")
    return Position(int(match[1]), int(match[2]) if match[2] is not None else None)


def run_start(job: Job) -> Position:
    """Where the run ``job`` is in began: after the execution's last pause for a person (its
    ``job.waiting`` and the asks logged with it) that is not the one it waits on now (0: its
    admission)."""
    pauses = list(Event.objects.filter(session_id=job.session_id, type__in=("job.waiting", *ASK_EVENTS),
                                       payload__job=job.pk).values_list("seq", "type"))
    if job.status == JobStatus.WAITING:
        latest = max((seq for seq, kind in pauses if kind == "job.waiting"), default=0)
        pauses = [(seq, kind) for seq, kind in pauses if seq < latest]
    return Position(max((seq for seq, _ in pauses), default=0))


# --- frames -----------------------------------------------------------------------------------


def node_of(message: Message) -> str:
    return TOOLS_NODE if message.role == MessageRole.TOOL else values.AGENT_NODE


class RunFrames:
    """The frames of one run's events, for one viewer and the stream modes they asked for."""

    def __init__(self, viewer, session: Session, job: Job, modes: tuple[str, ...]):
        self.viewer, self.session, self.job, self.modes = viewer, session, job, modes
        self.memo = Memo()
        self.tip: Message | None = None  # the run's latest message seen by this stream

    def of(self, wire: dict) -> tuple[list[tuple[str, object]], str | None]:
        """(the frames of ``wire`` — (event, data) pairs —, the run's end status if it ends there)."""
        kind, payload = wire.get("type"), wire.get("payload") or {}
        if kind == "message.created":
            return self._message(payload.get("id")), None
        if kind == "message.delta":
            return self._delta(payload), None
        if kind in ASK_EVENTS:
            return self._interrupt(payload.get("ask")), None
        if str(kind).startswith("job.") and payload.get("status") in DONE_STATUSES:
            return self.end(payload["status"], payload.get("error_code") or "")
        return [], None

    def end(self, status: str, error_code: str) -> tuple[list, str]:
        """The run ended ``status`` (as this event says: the execution may have gone on since)."""
        if status not in (JobStatus.FAILED, JobStatus.INTERRUPTED):
            return [], run_status(status, error_code)
        job = Job.objects.filter(pk=self.job.pk).only("status", "error_reason").first()
        reason = job.error_reason if job is not None and job.status == status else ""
        return ([("error", {"error": error_code or status, "message": reason or f"the run {status}"})],
                run_status(status, error_code))

    def _message(self, message_id) -> list:
        message = Message.objects.filter(pk=message_id, session_id=self.session.pk).first() if message_id else None
        if message is None:
            return []
        self.tip = message
        shaped = values.langchain_message(self.viewer, message)
        if shaped is None:
            return []
        frames = []
        if MESSAGES in self.modes and shaped["type"] in ("ai", "tool"):
            frames.append(("messages", [self._complete(message, shaped), self._metadata(message)]))
        if UPDATES in self.modes and message.pk != self.job.prompt_msg_id:
            frames.append(("updates", {node_of(message): {"messages": [shaped]}}))
        if VALUES in self.modes:
            frames.append(("values", values.thread_values(self.viewer, self.session, tip=message)))
        return frames

    def _complete(self, message: Message, shaped: dict) -> dict:
        """An ai or tool message as ``messages-tuple`` sends it: whole — or, for an ai message
        whose text was streamed as it was generated, the last chunk of that stream (same id as its
        deltas, no more text, its tool calls)."""
        if shaped["type"] != "ai":
            return shaped
        call = Message.objects.filter(job_id=self.job.pk, branch_id=message.branch_id, role=MessageRole.ASSISTANT,
                                      depth__lt=message.depth).count()
        streamed = Event.objects.filter(session_id=self.session.pk, type="message.delta", payload__job=self.job.pk,
                                        payload__call=call).exists()
        if not streamed:
            return shaped
        return {**_chunk(self.job.pk, call, ""), "tool_calls": shaped.get("tool_calls", []),
                "tool_call_chunks": [{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": n,
                                      "type": "tool_call_chunk"} for n, c in enumerate(shaped.get("tool_calls", []))],
                "chunk_position": "last"}

    def _metadata(self, message: Message | None) -> dict:
        return {"run_id": self.job.pk, "thread_id": self.session.pk,
                "langgraph_node": node_of(message) if message is not None else values.AGENT_NODE,
                "langgraph_step": message.depth if message is not None else None,
                "langgraph_checkpoint_ns": "", "checkpoint_ns": ""}

    def _delta(self, payload: dict) -> list:
        if MESSAGES not in self.modes or not isinstance(payload.get("text"), str):
            return []
        return [("messages", [_chunk(self.job.pk, payload.get("call"), payload["text"]), self._metadata(None)])]

    def _interrupt(self, ask_id) -> list:
        ask = PersonAsk.objects.filter(pk=ask_id, job_id=self.job.pk).select_related("to_user").first() if ask_id else None
        if ask is None:
            return []
        interrupt = values.interrupt_of(self.viewer, ask)
        frames = []
        if UPDATES in self.modes:
            frames.append(("updates", {"__interrupt__": [interrupt]}))
        if VALUES in self.modes:
            tip = self.tip or last_message(self.job, until=ask.created_at)
            state = values.thread_values(self.viewer, self.session, tip=tip) if tip is not None else {"messages": []}
            frames.append(("values", {**state, "__interrupt__": [interrupt]}))
        return frames


def _chunk(job_id: str, call, text: str) -> dict:
    """A piece of a streaming model's answer, as an ``AIMessageChunk`` (every piece of one model
    call has the id ``run-<run_id>-<call>``)."""
    return {"type": "AIMessageChunk", "content": text, "id": f"run-{job_id}-{call}", "name": None,
            "additional_kwargs": {}, "response_metadata": {}, "tool_calls": [], "invalid_tool_calls": [],
            "tool_call_chunks": [], "usage_metadata": None}


def read_frames(frames: RunFrames, position: Position) -> tuple[list[tuple[str, str, object]], Position, str | None]:
    """The run's frames after ``position`` as (id, event, data), the position read through, and
    the run's end status when the run has ended there."""
    session_id = frames.session.pk
    job = Job.objects.filter(pk=frames.job.pk).only("status", "error_code").first()
    through = Session.objects.filter(pk=session_id).values_list("last_event_seq", flat=True).first() or 0
    wires = events_after(session_id, position.read_after, PAGE, viewer=frames.viewer, memo=frames.memo,
                         job=frames.job.pk)
    out, ended, last = [], None, position.read_after
    for wire in wires:
        if ended is not None and wire.get("type") not in ASK_EVENTS:
            break  # a pause's asks follow its ``job.waiting`` in the same commit: the run ends after them
        made, end = frames.of(wire)
        for n, (event, data) in enumerate(made):
            if wire["seq"] == position.seq and position.frame is not None and n <= position.frame:
                continue  # sent before the connection dropped
            out.append((f"{wire['seq']}-{n}", event, data))
        ended, last = ended or end, wire["seq"]
        if ended is not None and ended != INTERRUPTED:
            break
    if ended is not None:
        return out, Position(last), ended
    if len(wires) == PAGE:
        return out, Position(wires[-1]["seq"]), None
    through = Position(max([through, position.read_after] + [w["seq"] for w in wires]))
    if job is None or job.status in DONE_STATUSES:  # over before this read began: its events are all read
        made, ended = frames.end(job.status if job is not None else JobStatus.CANCELLED,
                                 job.error_code if job is not None else "")
        out += [(None, event, data) for event, data in made]
        return out, through, ended
    return out, through, None


# --- the long-lived answers -------------------------------------------------------------------


def _sse(event: str, data, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _about_job(message: dict, job_id: str) -> bool:
    """A message of the session's group that may concern the run (a poke: anything may)."""
    if message.get("type") != "collab.event":
        return True
    return any((wire.get("payload") or {}).get("job") == job_id or wire.get("type") == "message.created"
               for wire in pushed_wires(message))


async def _next_change(subscription: Subscription, job_id: str) -> bool:
    """Wait until something about the run may have happened (True), or a heartbeat is due (False)."""
    if not subscription.listening:  # no channel layer: read the log on a timer
        await asyncio.sleep(settings.TRELLIS_EVENT_POLL_INTERVAL)
        return True
    while True:
        message = await subscription.next(SSE_HEARTBEAT_SECONDS)
        if message is None:
            return False
        if _about_job(message, job_id):
            return True


async def _subscribe(request, session_id: str) -> Subscription:
    """The session's subscription — under ASGI (daphne); a request served without it (Django's
    test client) reads the log on a timer and subscribes to nothing, so that no relay of its
    own reads the database from under it."""
    if isinstance(request, ASGIRequest):
        return await Subscription.open(session_id)
    return Subscription(None, session_id)


_disconnect_tasks: set[asyncio.Task] = set()


def _on_disconnect(work) -> None:
    """Run ``work`` (sync database work) after the client went away, without keeping them waiting."""
    task = asyncio.get_running_loop().create_task(briefly(work))
    _disconnect_tasks.add(task)
    task.add_done_callback(_disconnect_tasks.discard)


async def sse_frames(request, viewer, token_id: int | None, session: Session, job: Job, modes: tuple[str, ...],
                     position: Position, *, metadata: bool, slot, disconnected=None):
    """The run's Server-Sent Events from ``position`` on: the ``metadata`` frame first when
    ``metadata``, then its frames as they come, ``: heartbeat`` comments every
    ``SSE_HEARTBEAT_SECONDS`` (the viewer's access and token checked again), and ``end`` after
    its end. ``slot`` (the viewer's open-wait slot) is freed when the stream ends; ``disconnected``
    (sync work: the run's cancel) runs if the client leaves before the end."""
    subscription = await _subscribe(request, session.pk)
    frames = RunFrames(viewer, session, job, modes)
    ended = False
    try:
        if metadata:
            yield _sse("metadata", {"run_id": job.pk, "attempt": 1}, position.last_event_id)
        while True:
            batch, position, status = await in_thread(request, read_frames, frames, position)
            for event_id, event, data in batch:
                yield _sse(event, data, event_id)
            if status is not None:
                ended = True
                yield _sse("end", {"run_id": job.pk, "status": status})
                return
            if not await _next_change(subscription, job.pk):
                if not await in_thread(request, access.still_reads_job, viewer, token_id, job.pk):
                    ended = True  # nothing to cancel for someone who may no longer see it
                    return
                yield ": heartbeat\n\n"
    finally:
        await subscription.close()
        slot.free()
        if not ended and disconnected is not None:
            _on_disconnect(disconnected)


def _read_output(viewer, job_id: str) -> dict | None:
    """The run's output once it is over, else None."""
    job = Job.objects.select_related("session").filter(pk=job_id).first()
    if job is None or job.status not in DONE_STATUSES:
        return None
    return run_output(viewer, job)


async def output_when_done(request, viewer, token_id: int | None, session_id: str, job_id: str, *, slot,
                           disconnected=None):
    """``runs.wait``'s and ``runs.join``'s body: a newline every ``SSE_HEARTBEAT_SECONDS`` while
    the run goes on (JSON ignores the whitespace before a value; proxies see a live connection),
    then the output (``run_output``) once it is over. ``slot`` is freed when it ends;
    ``disconnected`` runs if the client leaves before."""
    subscription = await _subscribe(request, session_id)
    ended = False
    try:
        while True:
            output = await in_thread(request, _read_output, viewer, job_id)
            if output is not None:
                ended = True
                yield json.dumps(output, separators=(",", ":"), default=str)
                return
            if not await _next_change(subscription, job_id):
                if not await in_thread(request, access.still_reads_job, viewer, token_id, job_id):
                    ended = True
                    return
                yield "\n"
    finally:
        await subscription.close()
        slot.free()
        if not ended and disconnected is not None:
            _on_disconnect(disconnected)

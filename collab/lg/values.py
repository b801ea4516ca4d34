"""The shapes of the LangGraph-compatible API (docs/langgraph.md), shared by its routes: a
session as a *thread*, its messages as LangChain messages, a message of its DAG as a
*checkpoint*, the asks waiting for a person as *interrupts*, an agent spec as an *assistant*.

Every function here reads through ``collab.access`` and Trellis's selectors and only
translates: a thread the viewer may not see is the ``NotFound`` of a missing id, and every
text shown passes the same per-viewer redaction as the native transcript
(``collab.selectors.redact``)."""

from datetime import datetime

from django.db.models import Case, CharField, Exists, JSONField, OuterRef, Q, Subquery, Value, When
from django.db.models.fields.json import KeyTransform, KeyTransformExact, KeyTransformIsNull

from accounts.policy import member_project_ids
from collab import access
from collab.errors import DomainError, Invalid, NotFound
from collab.models import (
    AgentSpec,
    AskKind,
    AskStatus,
    Branch,
    Job,
    JobKind,
    JobStatus,
    Message,
    MessageKind,
    MessageRole,
    PersonAsk,
    Session,
)
from collab.selectors.redact import redact_messages, redact_texts
from collab.selectors.transcript import lineage, lineage_ids
from collab.services.turns import selected_branch

# What a route means to do to a thread → the capability it needs there (``collab.access``).
ACTIONS = {
    "read": "project.read",  # state, history, join a run
    "run": "turn.start",  # start a run, resume an interrupt
    "update": "turn.start",  # PATCH a thread's metadata
}

# A thread's state carries at most this many messages: the newest of its line (docs/langgraph.md#state-and-checkpoints)
MAX_STATE_MESSAGES = 1000

# The one node name Trellis reports (``next``, a task's ``name``): an agent's turn is one step to LangGraph
AGENT_NODE = "agent"

# The thread statuses of LangGraph (langgraph_sdk.schema.ThreadStatus)
IDLE, BUSY, INTERRUPTED, ERROR = "idle", "busy", "interrupted", "error"
THREAD_STATUSES = (IDLE, BUSY, INTERRUPTED, ERROR)

# metadata keys a thread's row answers for itself (read-only; ``metadata.project`` names the project)
DERIVED_METADATA = ("project", "graph_id", "assistant_id")

# a job that holds the thread busy: admitted, running or stopping (waiting for a person is "interrupted")
BUSY_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.STOPPING)
ERROR_STATUSES = (JobStatus.FAILED,)


class Unsupported(DomainError):
    """A field or value of LangGraph's API that Trellis cannot honour: named, never ignored."""

    status = 422
    code = "unsupported"


class UnsupportedRoute(Unsupported):
    """A LangGraph route Trellis does not offer for a resource it has (creating an assistant)."""

    status = 405


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def paginate(rows, limit: int, offset: int, response=None) -> list:
    """``rows[offset:offset + limit]``; one more row is read to tell whether a next page exists,
    and then ``response`` (the route's ``HttpResponse``) carries ``X-Pagination-Next``: the
    offset of that page, as LangGraph's server answers (``langgraph_sdk`` reads it)."""
    page = list(rows[offset:offset + limit + 1])
    if len(page) > limit:
        page = page[:limit]
        if response is not None:
            response["X-Pagination-Next"] = str(offset + limit)
    return page


def selected(shape: dict, fields) -> dict:
    """``shape`` with only ``fields`` (a request's ``select``; None or empty: all of it)."""
    return {k: v for k, v in shape.items() if k in fields} if fields else shape


def messages_schema() -> dict:
    """The JSON schema of a thread's state: ``{"messages": [LangChain message, …]}``."""
    message = {"type": "object", "properties": {
        "type": {"type": "string", "enum": ["human", "ai", "tool", "system"]},
        "content": {"type": "string"}, "id": {"type": "string"}, "name": {"type": ["string", "null"]},
        "tool_calls": {"type": "array", "items": {"type": "object"}}, "tool_call_id": {"type": "string"},
    }, "required": ["content"]}
    return {"title": "State", "type": "object", "properties": {"messages": {"type": "array", "items": message}}}


# --- threads -----------------------------------------------------------------------------------


def thread_of(viewer, thread_id: str, action: str = "read") -> Session:
    """The session ``thread_id`` names, if ``viewer`` may do ``action`` there (``ACTIONS``):
    a thread they may not see, or none, is ``NotFound``; a role too low is ``Forbidden``."""
    if not isinstance(thread_id, str) or not thread_id:
        raise NotFound()
    return access.access_session(viewer, thread_id, ACTIONS[action])


def thread_branch(session: Session) -> Branch:
    """The branch the thread's runs go to and its state is read from: the branch of the
    session's selected head (a fork or a rollback moves it), else its first branch — where a
    person's turn without a ``branch`` goes (``collab.services.turns.selected_branch``)."""
    return selected_branch(session)


def thread_tip(session: Session) -> Message | None:
    """The thread's latest checkpoint: its branch's tip (None before the first message)."""
    branch = thread_branch(session)
    return Message.objects.filter(pk=branch.tip_id).first() if branch.tip_id else None


def busy_jobs():
    """The jobs that make their session's thread ``busy``."""
    return Job.objects.filter(status__in=BUSY_STATUSES)


def pending_asks():
    return PersonAsk.objects.filter(status=AskStatus.PENDING)


def with_thread_status(sessions):
    """``sessions`` annotated with their thread's LangGraph status as ``lg_status``, decided in
    SQL — the one rule, which searches filter and sort by and ``thread_status`` reads:
    ``interrupted`` while an ask waits for a person in the session, else ``busy`` while a job is
    queued, running or stopping there, else ``error`` when its latest person's run failed,
    else ``idle``."""
    latest_user_run = Job.objects.filter(session_id=OuterRef("pk"), kind=JobKind.USER).order_by("-created_at", "-pk")
    return sessions.alias(lg_last_run=Subquery(latest_user_run.values("status")[:1])).annotate(lg_status=Case(
        When(Exists(pending_asks().filter(session_id=OuterRef("pk"))), then=Value(INTERRUPTED)),
        When(Exists(busy_jobs().filter(session_id=OuterRef("pk"))), then=Value(BUSY)),
        When(lg_last_run__in=ERROR_STATUSES, then=Value(ERROR)),
        default=Value(IDLE), output_field=CharField()))


def status_filter(status: str) -> Q:
    """The ``Q`` of sessions annotated by ``with_thread_status`` whose status is ``status``."""
    return Q(lg_status=status)


def metadata_filter(sessions, metadata: dict):
    """``sessions`` whose thread metadata (``thread_metadata``) holds every pair of ``metadata``:
    the derived keys by their columns, the client's own by JSON equality of that key's value
    (a key it does not have matches nothing, a null value only a key set to null)."""
    if not isinstance(metadata, dict):
        raise Invalid("metadata must be a JSON object", code="invalid_metadata")
    for key, value in metadata.items():
        if key == "project":
            sessions = sessions.filter(project__slug=value) if isinstance(value, str) else sessions.none()
        elif key == "graph_id":
            sessions = (sessions.filter(agent_spec__isnull=True) if value is None else
                        sessions.filter(agent_spec__agent_id=value) if isinstance(value, str) else sessions.none())
        elif key == "assistant_id":
            sessions = (sessions.filter(agent_spec__isnull=True) if value is None else
                        sessions.filter(agent_spec_id=int(value)) if _is_spec_id(value) else sessions.none())
        else:
            # an expression, not ``metadata__<key>``: a key is the client's text, "__" and all
            field = KeyTransform(key, "metadata")
            sessions = sessions.filter(KeyTransformExact(field, Value(value, output_field=JSONField())),
                                       KeyTransformIsNull(field, False))
    return sessions


def _is_spec_id(value) -> bool:
    return isinstance(value, str) and value.isdigit() and len(value) <= 18


def thread_status(session: Session) -> str:
    """The thread's LangGraph status (``with_thread_status``'s rule; read now unless the row
    carries it)."""
    if not hasattr(session, "lg_status"):
        _read_statuses([session])
    return session.lg_status


def _read_statuses(sessions: list[Session]) -> None:
    """Give the rows that lack it ``with_thread_status``'s ``lg_status`` (one query for all)."""
    missing = {s.pk: s for s in sessions if not hasattr(s, "lg_status")}
    if not missing:
        return
    read = dict(with_thread_status(Session.objects.filter(pk__in=list(missing))).values_list("pk", "lg_status"))
    for pk, session in missing.items():
        session.lg_status = read.get(pk, IDLE)


def thread_metadata(session: Session) -> dict:
    """The thread's metadata: the client's own keys (``Session.metadata``) and the ones Trellis
    answers for (``DERIVED_METADATA``: the project's slug, the spec's ``agent_id`` as
    ``graph_id`` and its id as ``assistant_id``)."""
    spec = session.agent_spec if session.agent_spec_id else None
    return {**(session.metadata or {}), "project": session.project.slug,
            "graph_id": spec.agent_id if spec is not None else None,
            "assistant_id": str(spec.pk) if spec is not None else None}


def thread_shape(viewer, session: Session, *, values: bool = True) -> dict:
    """A LangGraph ``Thread`` (langgraph_sdk.schema.Thread) of ``session`` as ``viewer`` may read
    it. ``values=False`` leaves the messages out (``values`` is ``{}``), for listings that do not
    ask for them."""
    return thread_shapes(viewer, [session], values=values)[0]


def thread_shapes(viewer, sessions: list[Session], *, values: bool = True) -> list[dict]:
    """``thread_shape`` of each session (rows with their project and spec loaded), read
    together: one query for the statuses (none when the rows carry them), one for the pending
    asks, one for the messages of all their lines — and per thread its branch and line's ids."""
    _read_statuses(sessions)
    interrupts = _interrupts_of_sessions(viewer, [s.pk for s in sessions])
    messages = _values_of_sessions(viewer, sessions) if values else {}
    shapes = []
    for session in sessions:
        grouped: dict[str, list[dict]] = {}
        for interrupt in interrupts.get(session.pk, []):
            grouped.setdefault(interrupt["value"]["trellis"]["run_id"], []).append(interrupt)
        shapes.append({
            "thread_id": session.pk,
            "created_at": iso(session.created_at),
            "updated_at": iso(session.last_active_at),
            "metadata": thread_metadata(session),
            "status": thread_status(session),
            "values": {"messages": messages.get(session.pk, [])} if values else {},
            "interrupts": grouped,
        })
    return shapes


def _values_of_sessions(viewer, sessions: list[Session]) -> dict[str, list[dict]]:
    """Each session's state messages (``thread_values``), their rows read in one query."""
    lines = {s.pk: lineage_ids(tip_id, MAX_STATE_MESSAGES) for s in sessions
             if (tip_id := thread_branch(s).tip_id)}
    rows: dict[str, list[Message]] = {}
    wanted = [pk for ids in lines.values() for pk in ids]
    for message in Message.objects.filter(pk__in=wanted).order_by("depth") if wanted else ():
        rows.setdefault(message.session_id, []).append(message)
    return {sid: langchain_messages(viewer, sid, found) for sid, found in rows.items()}


# --- LangChain messages ------------------------------------------------------------------------

_TYPES = {MessageRole.USER: "human", MessageRole.ASSISTANT: "ai", MessageRole.TOOL: "tool",
          MessageRole.SYSTEM: "system"}


def _additional(message: Message) -> dict:
    """What Trellis knows of a message beyond LangChain's fields: where it came from (a
    delegated task, a result, a notice) and on which branch it was written."""
    extra = {"branch": message.branch_id}
    if message.kind != MessageKind.NORMAL:
        extra["kind"] = message.kind
    return {"trellis": extra}


def as_langchain(message: Message) -> dict | None:
    """``message`` (already redacted for its reader) as a LangChain message dict — the shape
    ``langchain_core.messages.messages_to_dict`` data carries on LangGraph's wire: ``type``
    human/ai/tool/system, ``content``, ``id`` (the message id: a checkpoint's id too), ``tool_calls``
    on an ai message, ``tool_call_id`` on a tool message. An attach node (a sub-agent's
    marker, not a message) is None."""
    if message.kind == MessageKind.ATTACH:
        return None
    kind = _TYPES.get(message.role)
    if kind is None:
        return None
    shaped = {"type": kind, "content": message.text, "id": message.pk, "name": None,
              "additional_kwargs": _additional(message), "response_metadata": {}}
    if kind == "ai":
        calls = message.tool_calls if isinstance(message.tool_calls, list) else []
        shaped["tool_calls"] = [{"name": c.get("name"), "args": c.get("arguments") or {}, "id": c.get("id"),
                                 "type": "tool_call"} for c in calls if isinstance(c, dict)]
        shaped["invalid_tool_calls"] = []
        shaped["usage_metadata"] = None
    elif kind == "tool":
        meta = message.metadata or {}
        shaped["tool_call_id"] = message.tool_call_id
        shaped["name"] = meta.get("tool")
        shaped["status"] = "error" if meta.get("is_error") else "success"
        shaped["artifact"] = None
    return shaped


def langchain_messages(viewer, session_id: str, messages: list[Message]) -> list[dict]:
    """``messages`` of session ``session_id`` as LangChain messages ``viewer`` may read (redacted
    as one batch: at most a few queries however many), attach nodes left out."""
    redact_messages(viewer, session_id, messages)
    return [shaped for m in messages if (shaped := as_langchain(m)) is not None]


def langchain_message(viewer, message: Message) -> dict | None:
    """One Trellis message as a LangChain message ``viewer`` may read (None: not shown)."""
    shown = langchain_messages(viewer, message.session_id, [message])
    return shown[0] if shown else None


def thread_values(viewer, session: Session, *, tip: Message | None = None) -> dict:
    """The thread's state values at ``tip`` (default: its latest checkpoint,
    ``thread_tip``): ``{"messages": [...]}`` in the LangChain format, oldest first."""
    if tip is None:
        tip = thread_tip(session)
    return {"messages": langchain_messages(viewer, session.pk, lineage(tip, MAX_STATE_MESSAGES) if tip else [])}


# --- checkpoints and states -------------------------------------------------------------------


ROOT = "root"  # the checkpoint before a thread's first message (LangGraph's input checkpoint): no message


def checkpoint_of(session_id: str, message_id: str | None) -> dict:
    """A LangGraph ``Checkpoint``: a message of the thread's DAG (None: before the first)."""
    return {"thread_id": session_id, "checkpoint_ns": "", "checkpoint_id": message_id, "checkpoint_map": None}


def checkpoint_message(session: Session, checkpoint_id) -> Message:
    """The message ``checkpoint_id`` names in ``session`` (an attach node is no checkpoint);
    anything else is ``NotFound`` (a checkpoint of another thread too)."""
    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise NotFound("no such checkpoint in this thread", code="unknown_checkpoint")
    message = (Message.objects.filter(pk=checkpoint_id, session_id=session.pk)
               .exclude(kind=MessageKind.ATTACH).first())
    if message is None:
        raise NotFound("no such checkpoint in this thread", code="unknown_checkpoint")
    return message


def checkpoint_at(session: Session, checkpoint_id) -> Message | None:
    """``checkpoint_message``, where ``ROOT`` is a checkpoint too: None, before the first message."""
    return None if checkpoint_id == ROOT else checkpoint_message(session, checkpoint_id)


def checkpoint_id_in(checkpoint) -> str | None:
    """The ``checkpoint_id`` a client's checkpoint names: a string, a ``Checkpoint`` dict or a
    config (``{"configurable": {"checkpoint_id": …}}``); a namespace other than the root's is
    refused (Trellis has no subgraphs)."""
    if checkpoint is None or isinstance(checkpoint, str):
        return checkpoint or None
    if not isinstance(checkpoint, dict):
        raise Invalid("checkpoint must be a checkpoint id or an object with checkpoint_id", code="invalid_checkpoint")
    if isinstance(checkpoint.get("configurable"), dict):
        checkpoint = checkpoint["configurable"]
    if checkpoint.get("checkpoint_ns") not in (None, ""):
        raise Unsupported("checkpoint_ns: Trellis threads have no subgraphs; only the root namespace \"\" exists",
                      code="unsupported")
    value = checkpoint.get("checkpoint_id")
    if value is not None and not isinstance(value, str):
        raise Invalid("checkpoint_id must be a string", code="invalid_checkpoint")
    return value or None


def _step_metadata(message: Message) -> dict:
    """A checkpoint's metadata: its step (depth in the DAG), where it came from (``input``: a
    person's or another agent's prompt, ``loop``: the agent's own step), the run (execution)
    that wrote it and its branch."""
    return {"step": message.depth, "source": "input" if message.role == MessageRole.USER else "loop",
            "run_id": message.job_id, "branch": message.branch_id, "writes": None, "parents": {}}


def interrupts_of(viewer, session: Session) -> list[dict]:
    """The asks waiting for a person in the thread (docs/contract.md#people-in-the-loop), oldest
    first, as LangGraph ``Interrupt`` dicts ``{"value": …, "id": ask id}`` ``viewer`` may read.

    An approval's value is LangChain's human-in-the-loop request
    (``{"action_requests": [{"name", "args", "description"}], "review_configs":
    [{"action_name", "allowed_decisions"}]}``); a question's is ``{"question", "choices"}``.
    Both carry ``"trellis": {"ask", "kind", "tool", "tool_call_id", "run_id", "branch", "to",
    "expires_at"}``. docs/langgraph.md#interrupts lists the resume values each takes."""
    return _interrupts_of_sessions(viewer, [session.pk]).get(session.pk, [])


def _interrupts_of_sessions(viewer, session_ids: list[str]) -> dict[str, list[dict]]:
    """``interrupts_of`` for several sessions: one query, one redaction."""
    asks = list(pending_asks().filter(session_id__in=session_ids).select_related("to_user")
                .order_by("created_at", "pk"))
    if not asks:
        return {}
    own = session_ids[0] if len(session_ids) == 1 else None
    texts, _ = redact_texts(viewer, [[a.arguments, a.question, a.choices] for a in asks], own=own)
    found: dict[str, list[dict]] = {}
    for ask, text in zip(asks, texts):
        found.setdefault(ask.session_id, []).append({"value": _ask_value(ask, *text), "id": ask.pk})
    return found


def interrupt_of(viewer, ask: PersonAsk) -> dict:
    """One ask, pending or decided since, as the ``Interrupt`` ``interrupts_of`` gives (a run's
    stream shows the interrupt it raised whenever it is read: docs/langgraph.md#streaming)."""
    (text,), _ = redact_texts(viewer, [[ask.arguments, ask.question, ask.choices]], own=ask.session_id)
    return {"value": _ask_value(ask, *text), "id": ask.pk}


def _ask_value(ask: PersonAsk, arguments, question, choices) -> dict:
    about = {"ask": ask.pk, "kind": ask.kind, "tool": ask.tool, "tool_call_id": ask.tool_call_id,
             "run_id": ask.job_id, "branch": ask.branch_id,
             "to": ask.to_user.username if ask.to_user_id else None, "expires_at": iso(ask.expires_at)}
    if ask.kind == AskKind.APPROVAL:
        return {"action_requests": [{"name": ask.tool, "args": arguments,
                                     "description": f"The agent asks to call {ask.tool}; approve, edit or reject it."}],
                "review_configs": [{"action_name": ask.tool, "allowed_decisions": ["approve", "edit", "reject"]}],
                "trellis": about}
    return {"question": question, "choices": choices, "trellis": about}


def _tasks(interrupts: list[dict]) -> list[dict]:
    """A state's ``tasks``: one per run waiting for a person, with its interrupts."""
    grouped: dict[str, list[dict]] = {}
    for interrupt in interrupts:
        grouped.setdefault(interrupt["value"]["trellis"]["run_id"], []).append(interrupt)
    return [{"id": run_id, "name": AGENT_NODE, "path": [], "error": None, "interrupts": found,
             "checkpoint": None, "state": None, "result": None} for run_id, found in grouped.items()]


def state_at(session: Session, line: list[tuple[Message, dict | None]], index: int, *, latest: bool,
             interrupts: list[dict] | None = None, status: str | None = None) -> dict:
    """The ``ThreadState`` (langgraph_sdk.schema.ThreadState) at ``line[index]``: ``line`` is a
    line of the DAG oldest first, each message with its LangChain shape (``state_line``); the
    state's messages are the newest ``MAX_STATE_MESSAGES`` up to it. ``latest``: the thread's
    current state, which carries the pending ``interrupts`` and ``next`` while ``status`` is
    busy or interrupted."""
    message, _ = line[index]
    window = line[max(0, index + 1 - MAX_STATE_MESSAGES):index + 1]
    pending = (interrupts or []) if latest else []
    return {
        "values": {"messages": [shaped for _, shaped in window if shaped is not None]},
        "next": [AGENT_NODE] if latest and status in (BUSY, INTERRUPTED) else [],
        "checkpoint": checkpoint_of(session.pk, message.pk),
        "metadata": _step_metadata(message),
        "created_at": iso(message.created_at),
        "parent_checkpoint": checkpoint_of(session.pk, message.predecessor_id or ROOT),
        "tasks": _tasks(pending),
        "interrupts": pending,
    }


def state_line(viewer, session: Session, tip: Message | None, extra: int = 0) -> list[tuple[Message, dict | None]]:
    """``tip``'s line, oldest first — the newest ``MAX_STATE_MESSAGES + extra`` messages — each
    with its LangChain shape as ``viewer`` reads it (redacted as one batch)."""
    messages = lineage(tip, MAX_STATE_MESSAGES + extra) if tip is not None else []
    redact_messages(viewer, session.pk, messages)
    return [(m, as_langchain(m)) for m in messages]


def empty_state(session: Session, interrupts: list[dict], status: str) -> dict:
    """The state of a thread with no message yet."""
    return {"values": {"messages": []}, "next": [AGENT_NODE] if status in (BUSY, INTERRUPTED) else [],
            "checkpoint": checkpoint_of(session.pk, None), "metadata": {}, "created_at": None,
            "parent_checkpoint": None, "tasks": _tasks(interrupts), "interrupts": interrupts}


def root_state(session: Session) -> dict:
    """The state at ``ROOT``, before the thread's first message: no message (the parent of the
    first message's state; a run from it starts a new line, a new root of the DAG)."""
    return {"values": {"messages": []}, "next": [], "checkpoint": checkpoint_of(session.pk, ROOT),
            "metadata": {"step": -1, "source": "input"}, "created_at": iso(session.created_at),
            "parent_checkpoint": None, "tasks": [], "interrupts": []}


def state_shape(viewer, session: Session, *, checkpoint_id: str | None = None) -> dict:
    """The thread's ``ThreadState``: its latest, or at the checkpoint ``checkpoint_id`` (any
    message of its DAG, on any branch, or ``ROOT``: ``NotFound`` otherwise)."""
    tip = thread_tip(session)
    latest = True
    if checkpoint_id == ROOT:
        return root_state(session)
    if checkpoint_id is not None:
        asked = checkpoint_message(session, checkpoint_id)
        latest = tip is not None and asked.pk == tip.pk
        tip = asked
    status = thread_status(session)
    interrupts = interrupts_of(viewer, session) if latest else []
    if tip is None:
        return empty_state(session, interrupts, status)
    line = state_line(viewer, session, tip)
    return state_at(session, line, len(line) - 1, latest=latest, interrupts=interrupts, status=status)


MAX_HISTORY = 100  # states in one history answer (each carries its messages)
HISTORY_SCAN = 1000  # how far back a history filtered by ``metadata`` looks for its states


def history_shape(viewer, session: Session, *, limit: int = 10, checkpoint_id: str | None = None,
                  before_id: str | None = None, metadata: dict | None = None) -> list[dict]:
    """The thread's states newest first (``POST /threads/{id}/history``): along the line of its
    latest checkpoint, or of ``checkpoint_id`` (that state first), or strictly before
    ``before_id``; only those whose metadata holds every pair of ``metadata``; at most
    ``limit`` (1 to ``MAX_HISTORY``)."""
    limit = max(1, min(limit, MAX_HISTORY))
    if checkpoint_id == ROOT:
        return [root_state(session)] if not metadata else []
    if before_id == ROOT:
        return []
    latest_tip = thread_tip(session)
    tip = latest_tip
    if checkpoint_id is not None:
        tip = checkpoint_message(session, checkpoint_id)
    if before_id is not None:
        before = checkpoint_message(session, before_id)
        tip = Message.objects.filter(pk=before.predecessor_id).first() if before.predecessor_id else None
    if tip is None:
        return []
    line = state_line(viewer, session, tip, extra=HISTORY_SCAN if metadata else limit)
    status = thread_status(session)
    interrupts = interrupts_of(viewer, session) if latest_tip is not None and tip.pk == latest_tip.pk else []
    states = []
    for index in range(len(line) - 1, -1, -1):
        message = line[index][0]
        if metadata and any(_step_metadata(message).get(k, _ABSENT) != v for k, v in metadata.items()):
            continue
        latest = latest_tip is not None and message.pk == latest_tip.pk
        states.append(state_at(session, line, index, latest=latest, interrupts=interrupts, status=status))
        if len(states) == limit:
            break
    return states


_ABSENT = object()


# --- assistants -------------------------------------------------------------------------------


def assistant_shape(spec: AgentSpec) -> dict:
    """A LangGraph ``Assistant`` (langgraph_sdk.schema.Assistant) of an agent spec: its id as
    ``assistant_id``, its ``agent_id`` as ``graph_id`` and name, its project in ``metadata``."""
    return {
        "assistant_id": str(spec.pk),
        "graph_id": spec.agent_id,
        "name": spec.agent_id,
        "description": None,
        "config": {},
        "context": {},
        "metadata": {"project": spec.project.slug, "provider": spec.provider, "model": spec.model or None,
                     "toolset": spec.toolset},
        "version": 1,
        "created_at": iso(spec.created_at),
        "updated_at": iso(spec.created_at),
    }


def visible_specs(viewer):
    """The agent specs of the projects ``viewer`` is an accepted member of (every member reads them)."""
    if not viewer or not viewer.is_authenticated:
        return AgentSpec.objects.none()
    return AgentSpec.objects.filter(project_id__in=member_project_ids(viewer)).select_related("project")


def assistant_of(viewer, assistant_id, *, project_id: int | None = None) -> AgentSpec:
    """The agent spec an ``assistant_id`` names for ``viewer``: its id (``assistant_shape``), or
    — as LangGraph accepts a graph's name in its place — an ``agent_id``, within ``project_id``
    when given (a thread's project), else among all the viewer's projects, where it must name
    one spec. Anything the viewer may not see is ``NotFound``."""
    if not isinstance(assistant_id, str) or not assistant_id.strip():
        raise NotFound("no such assistant", code="unknown_assistant")
    specs = visible_specs(viewer)
    if project_id is not None:
        specs = specs.filter(project_id=project_id)
    if _is_spec_id(assistant_id):
        spec = specs.filter(pk=int(assistant_id)).first()
        if spec is not None:
            return spec
    found = list(specs.filter(agent_id=assistant_id)[:2])
    if not found:
        raise NotFound("no such assistant", code="unknown_assistant")
    if len(found) > 1:
        raise Invalid(f"graph_id {assistant_id!r} names an agent in several of your projects; use its assistant_id "
                      "or name the project (metadata.project)", code="ambiguous_assistant")
    return found[0]

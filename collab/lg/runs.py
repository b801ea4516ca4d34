"""LangGraph-compatible runs routes (docs/langgraph.md#runs): a run is a person's turn on the
thread's branch — one execution (``run_id`` = its id) from its admission, or from the decision
that resumed it, to its end or its next pause for a person.

Every route authorizes through ``collab.access`` (a thread or run the caller may not see is the
404 of a missing one) and calls Trellis's own services: ``do_start_user_turn`` (the four
``multitask_strategy``), ``fork_and_follow`` (a run from a checkpoint), the asks' ``decide``
(``command.resume``), the cancel command. What Trellis cannot honour is a 422 ``unsupported``
naming the field, checked before anything is written."""

import weakref
from functools import partial
from typing import Any, Literal

from django.db.models import Q
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Header, Query, Router

from accounts.models import TokenScope
from collab import access
from collab.errors import Conflict, DomainError, Forbidden, Invalid, NotFound
from collab.lg import stream
from collab.lg.values import (
    Unsupported,
    UnsupportedRoute,
    assistant_of,
    checkpoint_id_in,
    checkpoint_at,
    iso,
    paginate,
    pending_asks,
    selected,
    thread_branch,
    thread_of,
    thread_tip,
)
from collab.models import STRATEGIES, AskKind, Job, JobKind, JobStatus, Message
from collab.realtime.bounds import MAX_WAIT_SECONDS, open_wait
from collab.realtime.subscription import until_terminal
from collab.realtime.threads import in_thread
from collab.schemas import StrictIn
from collab.scopes import request_token
from collab.services.admission import check_prompt
from collab.services.asks import check_decision, decide
from collab.services.turns import (
    INTERRUPT,
    ROLLBACK,
    check_not_child,
    do_start_user_turn,
    fork_and_follow,
    interrupt_job,
    rollback_and_start,
    spec_strategy,
)
from collab.tools.registry import check_arguments

router = Router(tags=["runs"])

RUN_FIELDS = ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status", "metadata",
              "multitask_strategy", "cancel_reason")
MAX_RUNS = 1000
Strategy = Literal[STRATEGIES]  # type: ignore[valid-type]
Modes = str | list[str]
SELECT_QUERY = Query(None, description="the run's fields to answer")
MODES_QUERY = Query(None, description="the stream modes (default: values, updates and messages-tuple)")
LAST_EVENT_ID = Header(None, alias="Last-Event-ID", description="the id of the last frame received")


class RunIn(StrictIn):
    """A run's request, as ``langgraph_sdk``'s ``runs.create`` / ``wait`` / ``stream`` send it.
    Every field LangGraph defines is named here, so a field Trellis cannot honour is refused with
    its name (``check_supported``), and one LangGraph does not define is a 422."""

    assistant_id: str
    input: dict[str, Any] | None = None
    command: dict[str, Any] | None = None
    stream_mode: Modes | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    interrupt_before: Modes | None = None
    interrupt_after: Modes | None = None
    feedback_keys: list[str] | None = None
    webhook: str | None = None
    multitask_strategy: Strategy | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: float | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    strict_resume: bool | None = None
    langsmith_tracer: dict[str, Any] | None = None


# --- what a request asks for ------------------------------------------------------------------


def stream_modes(raw, *, default: tuple[str, ...] = (stream.VALUES,)) -> tuple[str, ...]:
    """The stream modes asked for (a name or a list; absent or blank: ``default``), each one
    Trellis streams (docs/langgraph.md#streaming), else 422 naming it."""
    names = [raw] if isinstance(raw, str) else list(raw or [])
    names = [n for n in names if isinstance(n, str) and n.strip()]
    if not names:
        return default
    unknown = [n for n in names if n not in stream.ACCEPTED_MODES]
    if unknown:
        raise Unsupported(f"stream_mode {', '.join(map(repr, unknown))}: Trellis streams "
                          f"{', '.join(stream.ACCEPTED_MODES)}", field="stream_mode")
    return tuple(dict.fromkeys(names))


def _refuse(field: str, why: str):
    raise Unsupported(f"{field}: {why}", field=field)


def check_supported(payload: RunIn, *, background: bool = False) -> None:
    """Refuse, naming it, every field whose value Trellis cannot honour (docs/langgraph.md#runs)."""
    if payload.metadata:
        _refuse("metadata", "a run keeps no metadata of its own; keep it on the thread")
    if payload.context:
        _refuse("context", "an agent spec is configured where it is saved, not per run")
    _check_config(payload.config)
    for name in ("interrupt_before", "interrupt_after"):
        if getattr(payload, name):
            _refuse(name, "a Trellis run pauses for a person where its agent spec's approvals say "
                          "(docs/langgraph.md#interrupts)")
    if payload.feedback_keys:
        _refuse("feedback_keys", "Trellis keeps no feedback")
    if payload.webhook is not None:
        _refuse("webhook", "register a webhook on the project (POST /api/projects/{slug}/webhooks)")
    if payload.if_not_exists == "create":
        _refuse("if_not_exists", "create the thread first (POST /threads): its project must be named")
    if payload.on_completion is not None:
        _refuse("on_completion", "Trellis runs only on threads (no stateless runs)")
    if payload.after_seconds:
        _refuse("after_seconds", "Trellis starts a run when it is admitted")
    if payload.durability == "exit":
        _refuse("durability", "Trellis writes every message of a run as it goes (\"sync\")")
    if payload.checkpoint_during is False:
        _refuse("checkpoint_during", "Trellis writes every message of a run as it goes")
    if payload.langsmith_tracer is not None:
        _refuse("langsmith_tracer", "Trellis traces with OpenTelemetry (docs/operations.md)")
    if background and payload.on_disconnect is not None:
        _refuse("on_disconnect", "a background run has no connection to lose")
    if payload.command is not None:
        if payload.input is not None:
            raise Invalid("input and command cannot be combined: resume with command, or send input",
                          code="invalid_run")
        if payload.checkpoint is not None or payload.checkpoint_id is not None:
            _refuse("checkpoint", "a resume continues the run that waits; it does not fork")
        extra = sorted(set(payload.command) - {"resume"})
        if extra:
            _refuse(f"command.{extra[0]}", "Trellis resumes an interrupt (command.resume) and nothing else")
        if "resume" not in payload.command:
            raise Invalid("command must have resume: the value that decides the interrupt", code="invalid_run")
    elif payload.input is None and not _names_checkpoint(payload):
        raise Invalid("input is required: {\"messages\": [{\"role\": \"user\", \"content\": \"…\"}]} "
                      "(or command.resume to decide an interrupt, or a checkpoint to ask again from)",
                      code="invalid_run")


def _names_checkpoint(payload: RunIn) -> bool:
    return bool(_named_checkpoints(payload))


def _named_checkpoints(payload: RunIn) -> set[str]:
    """The checkpoint ids a run names: ``checkpoint_id``, ``checkpoint``, ``config.configurable``."""
    configurable = (payload.config or {}).get("configurable") or {}
    return {c for c in (payload.checkpoint_id, checkpoint_id_in(payload.checkpoint),
                        checkpoint_id_in(configurable) if configurable else None) if c}


def _check_config(config) -> None:
    """A config may name the thread, a checkpoint of it and empty tags; nothing else is per run."""
    if not config:
        return
    for key, value in config.items():
        if key == "tags" and not value:
            continue
        if key != "configurable":
            _refuse(f"config.{key}", "an agent spec is configured where it is saved, not per run")
        if not isinstance(value, dict):
            raise Invalid("config.configurable must be an object", code="invalid_run")
        for name in value:
            if name not in ("thread_id", "checkpoint_id", "checkpoint_ns"):
                _refuse(f"config.configurable.{name}", "an agent spec is configured where it is saved, not per run")


def prompt_of(input: dict) -> str:
    """The text of the one human message a run's ``input`` holds (``{"messages": [{"role": "user"
    | "type": "human", "content": text or text blocks}]}``); anything else is refused naming it."""
    extra = sorted(set(input) - {"messages"})
    if extra:
        _refuse(f"input.{extra[0]}", "a Trellis thread's state holds only messages")
    messages = input.get("messages")
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list) or len(messages) != 1:
        raise Unsupported("input.messages: a run takes exactly one message, the person's (a list of one)",
                          field="input.messages")
    message = messages[0]
    if isinstance(message, str):
        return message
    if not isinstance(message, dict):
        raise Invalid("input.messages[0] must be a message object", code="invalid_run")
    extra = sorted(set(message) - {"role", "type", "content", "id", "name"})
    if extra:
        _refuse(f"input.messages[0].{extra[0]}", "a person's message is its role and content")
    kind = message.get("type", message.get("role"))
    if kind not in ("human", "user"):
        _refuse("input.messages[0].type", f"a run's input is a person's message (human / user), not {kind!r}")
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, block in enumerate(content):
            if isinstance(block, str):
                texts.append(block)
            elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            else:
                _refuse(f"input.messages[0].content[{n}]", "Trellis takes text content only")
        return "".join(texts)
    raise Invalid("input.messages[0].content must be text or a list of text blocks", code="invalid_run")


# --- starting a run ---------------------------------------------------------------------------


def start_run(user, token, thread_id: str, payload: RunIn, *, background: bool = False) -> tuple[Job, int, str | None]:
    """Start (or resume) the run ``payload`` asks for on the thread: (its execution, read again
    with its session; the seq of the thread's log before it; the strategy it was admitted with)."""
    job, before, strategy = _start(user, token, thread_id, payload, background)
    return Job.objects.select_related("session").get(pk=job.pk), before, strategy


def _start(user, token, thread_id: str, payload: RunIn, background: bool) -> tuple[Job, int, str | None]:
    session = thread_of(user, thread_id, "run")
    check_supported(payload, background=background)
    spec = assistant_of(user, payload.assistant_id, project_id=session.project_id)
    before = session.last_event_seq
    if payload.command is not None:
        return resume_run(user, token, session, payload.command["resume"]), before, None
    strategy = payload.multitask_strategy or spec_strategy(spec)
    if payload.input is None:
        return ask_again(user, session, _checkpoint_of(session, payload)[1], spec, strategy), before, strategy
    prompt = prompt_of(payload.input)
    check_prompt(prompt)
    check_not_child(session)
    named, fork_at = _checkpoint_of(session, payload)
    if named:
        tip = thread_tip(session)
        if (fork_at is None) != (tip is None) or (fork_at is not None and fork_at.pk != tip.pk):
            # not the latest checkpoint (from which a run simply goes on): a fork there, or before
            # the first message (``ROOT``) a new root
            return fork_and_follow(user, session, fork_at, prompt, spec=spec, strategy=strategy), before, strategy
    return start_on_thread(user, session, prompt, spec, strategy), before, strategy


CHECKPOINT_KEYS = frozenset({"thread_id", "checkpoint_ns", "checkpoint_id", "checkpoint_map"})


def _checkpoint_of(session, payload: RunIn) -> tuple[bool, Message | None]:
    """Whether a run names a checkpoint (``checkpoint_id``, ``checkpoint`` or
    ``config.configurable``), and its message (None: ``ROOT``, before the first message)."""
    configurable = (payload.config or {}).get("configurable") or {}
    if configurable.get("thread_id") not in (None, session.pk):
        raise Invalid("config.configurable.thread_id names another thread", code="invalid_run")
    if isinstance(payload.checkpoint, dict):  # a LangGraph Checkpoint: these keys, of this thread
        extra = sorted(set(payload.checkpoint) - CHECKPOINT_KEYS)
        if extra:
            _refuse(f"checkpoint.{extra[0]}", f"a checkpoint has {', '.join(sorted(CHECKPOINT_KEYS))} only")
        if payload.checkpoint.get("checkpoint_map"):
            _refuse("checkpoint.checkpoint_map", "Trellis threads have no subgraphs")
        if payload.checkpoint.get("thread_id") not in (None, session.pk):
            raise Invalid("checkpoint.thread_id names another thread", code="invalid_checkpoint")
    named = _named_checkpoints(payload)
    if len(named) > 1:
        raise Invalid("checkpoint_id, checkpoint and config name different checkpoints", code="invalid_checkpoint")
    return (True, checkpoint_at(session, named.pop())) if named else (False, None)


def ask_again(user, session, at: Message | None, spec, strategy: str) -> Job:
    """A run without input from a checkpoint: LangGraph runs the graph on from that state, which
    is what a client's "regenerate" sends, naming the state that ends with the person's message.
    Trellis asks that message again: a fork just before it (a new root for the thread's first
    message) whose input is the same text, so the answer is a new one and the old stays on its
    branch; the thread follows the fork, and what is open on the branch it leaves is dealt with by
    ``strategy`` (``fork_and_follow``). From any other checkpoint there is nothing to run on (a
    Trellis run ends with its agent's answer): 422 naming ``input``."""
    check_not_child(session)
    if at is None or not Job.objects.filter(prompt_msg_id=at.pk, kind=JobKind.USER).exists():
        _refuse("input", "a run without input asks a person's message again (regenerate); this checkpoint is "
                         "not a person's message: name the one before the answer, or send input")
    return fork_and_follow(user, session, at.predecessor, at.text, spec=spec, strategy=strategy)


def start_on_thread(user, session, prompt: str, spec, strategy: str) -> Job:
    """A person's turn on the thread's branch by ``strategy`` (``collab.services.turns``). A run
    waiting for a person holds the branch: ``interrupt`` and ``rollback`` cancel it as they
    cancel a running one; ``enqueue`` and ``reject`` are refused (resume it first)."""
    target = thread_branch(session)
    waiting = Job.objects.filter(branch_id=target.pk, status=JobStatus.WAITING).order_by("created_at", "pk").first()
    if waiting is not None:
        if strategy not in (INTERRUPT, ROLLBACK):
            raise Conflict(f"the thread waits for a person (run {waiting.pk} is interrupted): resume it with "
                           "command.resume, or send with multitask_strategy interrupt or rollback to cancel it",
                           code="thread_interrupted", run_id=waiting.pk)
        if strategy == ROLLBACK:
            access.require_can_archive(user, target)  # before anything is cancelled
        interrupt_job(user, waiting)
        if strategy == ROLLBACK:
            return rollback_and_start(user, session, target, waiting, prompt, spec)
    return do_start_user_turn(user, session, prompt, agent_id=spec.agent_id, multitask_strategy=strategy)


# --- resuming an interrupt --------------------------------------------------------------------

APPROVE_WORDS, REJECT_WORDS = ("approve", "approved", "accept", "yes"), ("reject", "rejected", "deny", "no")
RESUME_KEYS = {"type", "decision", "arguments", "args", "edited_action", "reason", "message", "answer"}


def decision_of(ask, value) -> tuple[str, dict]:
    """The decision (``approve`` / ``reject`` / ``answer`` and its fields) a resume value makes on
    ``ask`` (docs/langgraph.md#interrupts); anything else is a 400 ``invalid_resume``."""
    if isinstance(value, dict) and set(value) == {"decisions"}:  # LangChain's human-in-the-loop answer
        if not isinstance(value["decisions"], list) or len(value["decisions"]) != 1:
            raise Invalid("decisions must hold one decision: the interrupt asks about one call", code="invalid_resume")
        value = value["decisions"][0]
    if isinstance(value, dict):
        extra = sorted(set(value) - RESUME_KEYS)
        if extra:
            raise Invalid(f"resume: unknown key {extra[0]!r}", code="invalid_resume")
    if ask.kind == AskKind.QUESTION:
        if isinstance(value, str):
            return "answer", {"answer": value}
        if isinstance(value, dict) and isinstance(value.get("answer"), str):
            return "answer", {"answer": value["answer"]}
        if isinstance(value, dict) and (value.get("type") or value.get("decision")) in REJECT_WORDS:
            return "reject", {"reason": _reason(value)}
        raise Invalid("a question is resumed with its answer (a string, or {\"answer\": …}), or rejected "
                      "({\"type\": \"reject\", \"reason\": …})", code="invalid_resume")
    if value is True or (isinstance(value, str) and value.lower() in APPROVE_WORDS):
        return "approve", {}
    if value is False or (isinstance(value, str) and value.lower() in REJECT_WORDS):
        return "reject", {"reason": ""}
    if isinstance(value, dict):
        word = value.get("type", value.get("decision"))
        edited = value.get("edited_action")
        arguments = value.get("arguments", value.get("args"))
        if isinstance(edited, dict):
            arguments = edited.get("args", edited.get("arguments"))
        if word in REJECT_WORDS:
            return "reject", {"reason": _reason(value)}
        if word in (*APPROVE_WORDS, "edit") or (word is None and arguments is not None):
            if word == "edit" and arguments is None:
                raise Invalid("an edit names the call's new arguments (edited_action.args)", code="invalid_resume")
            return "approve", {"arguments": arguments} if arguments is not None else {}
    raise Invalid("an approval is resumed with true / \"approve\", false / \"reject\", "
                  "{\"type\": \"reject\", \"reason\": …} or {\"type\": \"edit\", \"edited_action\": {\"args\": {…}}}",
                  code="invalid_resume")


def _reason(value: dict) -> str:
    reason = value.get("reason", value.get("message", ""))
    if not isinstance(reason, str):
        raise Invalid("a rejection's reason must be text", code="invalid_resume")
    return reason


def resume_run(user, token, session, resume) -> Job:
    """Decide the interrupts ``resume`` answers — the only one waiting in the thread, or each
    ``{interrupt_id: value}`` names — and give back the run that waited (it goes on). Deciding
    needs the ``holds`` scope of a token, as in the inbox (docs/api.md#inbox). Every decision is
    checked before the first is recorded."""
    if token is not None and not token.allows(TokenScope.HOLDS):
        raise Forbidden("deciding an interrupt needs a token with the 'holds' scope "
                        f"(it has: {', '.join(token.scopes) or 'none'})", code="token_scope", scope="holds")
    pending = list(pending_asks().filter(session_id=session.pk).order_by("created_at", "pk"))
    ids = {a.pk for a in pending}
    if isinstance(resume, dict) and resume and set(resume) <= ids:
        answers = [(a, resume[a.pk]) for a in pending if a.pk in resume]
    elif not pending:
        raise Conflict("no interrupt waits in this thread", code="nothing_to_resume")
    elif len(pending) > 1:
        raise Conflict("several interrupts wait in this thread: resume with {interrupt_id: value}",
                       code="ambiguous_resume", interrupt_ids=sorted(ids))
    else:
        answers = [(pending[0], resume)]
    decisions = []
    for ask, value in answers:
        try:
            ask = access.access_ask(user, ask.pk)
        except NotFound:
            raise Forbidden(f"interrupt {ask.pk} is for another person to decide") from None
        decision, fields = decision_of(ask, value)
        if fields.get("arguments") is not None:
            toolset = ask.job.agent_spec.toolset if ask.job.agent_spec_id else "collab"
            fields["arguments"] = check_arguments(toolset, ask.tool, fields["arguments"])
        check_decision(ask, decision, **fields)
        decisions.append((ask, decision, fields))
    for ask, decision, fields in decisions:
        decide(user, ask, decision, **fields)
    return Job.objects.get(pk=decisions[0][0].job_id)


# --- shapes -----------------------------------------------------------------------------------


def run_shape(job: Job, strategy: str | None = None) -> dict:
    """A LangGraph ``Run`` (langgraph_sdk.schema.Run) of an execution. ``multitask_strategy`` is
    the one the run was admitted with, known when it is created (None afterwards: not kept)."""
    return {
        "run_id": job.pk,
        "thread_id": job.session_id,
        "assistant_id": str(job.agent_spec_id) if job.agent_spec_id else None,
        "created_at": iso(job.created_at),
        "updated_at": iso(job.finished_at or job.started_at or job.created_at),
        "status": stream.run_status(job.status, job.error_code),
        "metadata": {},
        "multitask_strategy": strategy,
        "cancel_reason": (job.error_reason or "cancelled") if job.status == JobStatus.CANCELLED else None,
    }


def run_of(user, session, run_id: str) -> Job:
    """The execution ``run_id`` of the thread ``session``: any other, or one the user may not
    see, is ``NotFound``."""
    job = access.access_job(user, run_id) if isinstance(run_id, str) and run_id else None
    if job is None or job.session_id != session.pk:
        raise NotFound("no such run in this thread", code="unknown_run")
    return job


def _locations(response, thread_id: str, run_id: str, follow: str) -> None:
    """Where a client picks the run up again: ``Location`` (``…/join`` or ``…/stream``) and
    ``Content-Location`` (the run), relative to the API's root as LangGraph's clients join them
    to their base URL (docs/langgraph.md#runs)."""
    response["Location"] = f"/threads/{thread_id}/runs/{run_id}/{follow}"
    response["Content-Location"] = f"/threads/{thread_id}/runs/{run_id}"


def _cancel_quietly(user, job_id: str) -> None:
    """Cancel the run after its client left (``on_disconnect="cancel"``), if it is still going."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return
    try:
        interrupt_job(user, job)
    except DomainError:  # ended meanwhile, or no longer theirs to cancel
        pass


def _sse_response(frames, slot) -> StreamingHttpResponse:
    weakref.finalize(frames, slot.free)  # a body never started (the client left first) frees it too
    response = StreamingHttpResponse(frames, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _json_response(body, slot) -> StreamingHttpResponse:
    weakref.finalize(body, slot.free)
    return StreamingHttpResponse(body, content_type="application/json")


def _token_id(request) -> int | None:
    return getattr(request_token(request), "pk", None)


# --- routes -----------------------------------------------------------------------------------


@router.post("threads/{thread_id}/runs", response={200: dict})
def create_run(request: HttpRequest, thread_id: str, payload: RunIn, response: HttpResponse):
    """A background run: admitted now (``pending``), run by a worker; follow it with
    ``GET …/runs/{run_id}``, ``…/join`` or ``…/stream``."""
    stream_modes(payload.stream_mode)
    job, _, strategy = start_run(request.auth, request_token(request), thread_id, payload, background=True)
    _locations(response, thread_id, job.pk, "stream")
    return run_shape(job, strategy)


async def _start_followed(request: HttpRequest, thread_id: str, payload: RunIn):
    """A run its request follows to the end (``runs.wait``, ``runs.stream``): the request's wait
    slot taken first (``open_wait``: too many waits is a 429 before anything is written), then
    the run started. Returns (the run, where its stream starts, the slot, what cancels it when
    its client leaves: ``on_disconnect="cancel"``, else None)."""
    slot = open_wait(request.auth)
    try:
        job, before, _ = await in_thread(request, start_run, request.auth, request_token(request), thread_id, payload)
    except BaseException:
        slot.free()
        raise
    cancel = partial(_cancel_quietly, request.auth, job.pk) if payload.on_disconnect == "cancel" else None
    return job, before, slot, cancel


@router.post("threads/{thread_id}/runs/wait", response={200: dict})
async def wait_run(request: HttpRequest, thread_id: str, payload: RunIn):
    """A run, answered when it is over (ended, or waiting for a person): the thread's values as it
    left them (``__interrupt__`` when it waits, ``__error__`` when it failed). Newlines keep the
    connection alive meanwhile; nothing is held while it waits."""
    job, _, slot, cancel = await _start_followed(request, thread_id, payload)
    body = stream.output_when_done(request, request.auth, _token_id(request), job.session_id, job.pk, slot=slot,
                                   disconnected=cancel)
    response = _json_response(body, slot)
    _locations(response, thread_id, job.pk, "join")
    return response


@router.post("threads/{thread_id}/runs/stream", response={200: None})
async def stream_run(request: HttpRequest, thread_id: str, payload: RunIn):
    """A run, streamed as Server-Sent Events in the ``stream_mode`` asked for (docs/langgraph.md#streaming):
    ``metadata`` first, then the run's frames as it goes, then ``end``. Every frame has an id: a
    client that lost the connection joins again with ``Last-Event-ID`` at ``Location``."""
    modes = stream_modes(payload.stream_mode)
    job, before, slot, cancel = await _start_followed(request, thread_id, payload)
    frames = stream.sse_frames(request, request.auth, _token_id(request), job.session, job, modes, stream.Position(before),
                               metadata=True, slot=slot, disconnected=cancel)
    response = _sse_response(frames, slot)
    _locations(response, thread_id, job.pk, "stream?" + "&".join(f"stream_mode={m}" for m in modes))
    return response


STATUS_QUERIES = {
    stream.PENDING: Q(status=JobStatus.QUEUED),
    stream.RUNNING: Q(status__in=(JobStatus.RUNNING, JobStatus.STOPPING)),
    stream.SUCCESS: Q(status=JobStatus.SUCCEEDED),
    stream.TIMEOUT: Q(status=JobStatus.FAILED, error_code__in=stream.TIMEOUT_CODES),
    stream.ERROR: Q(status=JobStatus.FAILED) & ~Q(error_code__in=stream.TIMEOUT_CODES) | Q(status=JobStatus.INTERRUPTED),
    stream.INTERRUPTED: Q(status__in=(JobStatus.WAITING, JobStatus.CANCELLED)),
}


@router.get("threads/{thread_id}/runs", response={200: list[dict]})
def list_runs(request: HttpRequest, thread_id: str, response: HttpResponse, limit: int = 10, offset: int = 0,
              status: Literal[tuple(STATUS_QUERIES)] | None = None,  # type: ignore[valid-type]
              select: list[Literal[RUN_FIELDS]] | None = SELECT_QUERY):  # type: ignore[valid-type]
    """The thread's runs — the turns people started there — newest first."""
    session = thread_of(request.auth, thread_id)
    jobs = Job.objects.filter(session_id=session.pk, kind=JobKind.USER).order_by("-created_at", "-pk")
    if status:
        jobs = jobs.filter(STATUS_QUERIES[status])
    page = paginate(jobs, max(1, min(limit, MAX_RUNS)), max(0, offset), response)
    return [selected(run_shape(job), select) for job in page]


@router.get("threads/{thread_id}/runs/{run_id}", response={200: dict})
def get_run(request: HttpRequest, thread_id: str, run_id: str):
    session = thread_of(request.auth, thread_id)
    return run_shape(run_of(request.auth, session, run_id))


@router.delete("threads/{thread_id}/runs/{run_id}", response={204: None})
def delete_run(request: HttpRequest, thread_id: str, run_id: str):
    run_of(request.auth, thread_of(request.auth, thread_id), run_id)
    raise UnsupportedRoute("deleting a run: an execution stays in its session's history (cancel it instead)")


def _run_to_follow(user, thread_id: str, run_id: str) -> Job:
    return run_of(user, thread_of(user, thread_id), run_id)


@router.get("threads/{thread_id}/runs/{run_id}/join", response={200: dict})
async def join_run(request: HttpRequest, thread_id: str, run_id: str):
    """The run's output once it is over (``runs.wait``'s answer), however long it takes."""
    job = await in_thread(request, _run_to_follow, request.auth, thread_id, run_id)
    slot = open_wait(request.auth)
    body = stream.output_when_done(request, request.auth, _token_id(request), job.session_id, job.pk, slot=slot)
    response = _json_response(body, slot)
    _locations(response, thread_id, job.pk, "join")
    return response


def _join_start(user, thread_id: str, run_id: str, last_event_id: str | None):
    """(the run, where its stream starts, whether to send ``metadata``): after ``Last-Event-ID``;
    with ``-1`` from the run's start; without one from now, as LangGraph's joined streams go."""
    job = _run_to_follow(user, thread_id, run_id)
    if last_event_id is not None and last_event_id.strip() == stream.FROM_RUN_START:
        return job, stream.run_start(job), True
    position = stream.parse_last_event_id(last_event_id)
    if position is not None:
        return job, position, False
    return job, stream.Position(job.session.last_event_seq), True


@router.get("threads/{thread_id}/runs/{run_id}/stream", response={200: None})
async def join_stream(request: HttpRequest, thread_id: str, run_id: str,
                      stream_mode: list[str] | None = MODES_QUERY, cancel_on_disconnect: bool = False,
                      last_event_id: str | None = LAST_EVENT_ID):
    """The run's Server-Sent Events (``runs.join_stream``; the ``Location`` of ``runs.stream``):
    resumed after ``Last-Event-ID`` exactly, or from now; in the modes asked for (default: all
    three, as a background run streams)."""
    modes = stream_modes(stream_mode, default=stream.STREAM_MODES)
    job, position, metadata = await in_thread(request, _join_start, request.auth, thread_id, run_id, last_event_id)
    slot = open_wait(request.auth)
    cancel = partial(_cancel_quietly, request.auth, job.pk) if cancel_on_disconnect else None
    frames = stream.sse_frames(request, request.auth, _token_id(request), job.session, job, modes, position,
                               metadata=metadata, slot=slot, disconnected=cancel)
    response = _sse_response(frames, slot)
    _locations(response, thread_id, job.pk, "stream")
    return response


def _cancel(user, thread_id: str, run_id: str, action: str) -> dict:
    job = _run_to_follow(user, thread_id, run_id)
    access.require_can_cancel(user, job)  # whether or not it has ended: the right comes first
    if action == "rollback":
        _refuse("action", "a cancelled run's messages stay in the thread; to go back, run from the checkpoint "
                          "before it (checkpoint_id)")
    interrupt_job(user, job)
    return run_shape(Job.objects.get(pk=job.pk))


def _status_of(job_id: str) -> dict:
    return {"status": Job.objects.filter(pk=job_id).values_list("status", flat=True).first()}


@router.post("threads/{thread_id}/runs/{run_id}/cancel", response={200: dict})
async def cancel_run(request: HttpRequest, thread_id: str, run_id: str, wait: bool = False,
                     action: Literal["interrupt", "rollback"] = "interrupt"):
    """Cancel the run (the execution's cancel command, docs/contract.md#cancel: members cancel
    runs they started, maintainers any). ``wait``: answer once it has stopped (at most
    ``MAX_WAIT_SECONDS``): a running turn stops within a beat, a waiting or queued one at once."""
    shape = await in_thread(request, _cancel, request.auth, thread_id, run_id, action)
    if wait:
        await until_terminal(request, thread_id, run_id, MAX_WAIT_SECONDS,
                             lambda: in_thread(request, _status_of, run_id))
        shape = await in_thread(request, lambda: run_shape(_run_to_follow(request.auth, thread_id, run_id)))
    return shape

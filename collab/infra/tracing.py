"""OpenTelemetry traces of the agents' turns (docs/operations.md#traces).

Off unless the operator sets ``OTEL_EXPORTER_OTLP_ENDPOINT`` (``settings.TRELLIS_TRACING``, read by
``collab.conf.otel``): then every call here answers at once — ``""``, or the shared no-op ``OFF`` —
and no OpenTelemetry module is ever imported. On, a process builds its tracer provider once, on
first use (a forked worker its own: ``PerProcess``), exporting over OTLP/HTTP in batches from a
thread of its own: ending a span only queues it, so no turn waits on the exporter.

**One trace per person's turn and everything it causes.** A job carries the W3C trace context of
the span that admitted it (``Job.trace_context``: the ``traceparent``, then ``;`` and the
``tracestate`` when there is one), written by the admission's own INSERT (``trace_context_now``);
the worker that runs the job, whichever process it is, starts the turn's ``invoke_agent`` span
under it. A child's turn hangs under the ``execute_tool`` span of the ``agent`` call that admitted
it, a delivery under its ``send_message`` call, a follow-up under the turn whose completion
admitted it. A job admitted outside any span (a person's turn, a tool-gateway call) starts a
trace of its own, whose id is derived from its execution id (``trace_id_of``): a turn that waited
for a person and runs again lands in the same trace. The root session's id travels in the
``tracestate`` (``trellis=<session id>``).

Spans and attributes follow the OpenTelemetry GenAI semantic conventions at ``SEMCONV_VERSION``
(the tracer's ``schema_url``). Those conventions are in "Development" status: names may change in a
later version, which Trellis then adopts deliberately. No prompt, answer, tool argument or result
is recorded: names, ids, models, token counts and error codes only.
"""

import contextvars
import hashlib
import logging
import re
import threading
from multiprocessing import util as multiprocessing_util

from django.conf import settings

from collab.infra.per_process import PerProcess

log = logging.getLogger(__name__)
SEMCONV_VERSION = "1.37.0"  # the GenAI attributes as that release of the semantic conventions names them
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = "trellis"
DEFAULT_SERVICE_NAME = "trellis"  # unless OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) says

ENABLED: bool = bool(getattr(settings, "TRELLIS_TRACING", False))

MAX_CONTEXT = 512  # Job.trace_context's length
STATE_KEY = "trellis"  # the tracestate member that carries the root session's id
MAX_NAME = 100  # a name the model or a tenant chose (a tool's, a branch's), cut in spans
ENDED_IN_ERROR = frozenset({"failed", "cancelled", "interrupted"})
EXIT_FLUSH_MILLIS = 10_000
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

# the span of ours current in this thread (the turn's, a model call's, a tool call's): what an
# admission records, and the parent of the next span of the turn
_current: contextvars.ContextVar = contextvars.ContextVar("trellis_span", default=None)


class _Off:
    """What every span call answers while tracing is off, or outside a traced turn: a context
    manager and handle that records nothing."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def answered(self, **usage) -> None:
        pass

    def returned(self, **outcome) -> None:
        pass

    def ended(self, **outcome) -> None:
        pass


OFF = _Off()


def trace_id_of(execution_id: str) -> int:
    """The trace id of the work an execution admitted outside any span starts (a person's turn):
    the same at every run of that execution."""
    digest = hashlib.sha256(f"trellis-trace:{execution_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def trace_context_now() -> str:
    """The trace context a job admitted now carries (``Job.trace_context``): the current span of
    a traced turn (a tool call's, or the turn's own in its completion), with the root session's
    id in its tracestate; ``""`` outside one, and always while tracing is off."""
    if not ENABLED:
        return ""
    span = _current.get()
    return "" if span is None else span.carried()


def invoke_agent(*, carried: str, person_turn: bool, execution_id: str, kind: str, agent_name: str,
                 branch_id: str, session_id: str, spec_agent_id: str = "", provider: str = "", model: str = ""):
    """The span of one run of a turn (``invoke_agent {agent}``), under the span ``carried`` names
    (the job's ``trace_context``), made current for the run; ``OFF`` while tracing is off. The
    handle's ``ended(status, error_code, tokens_in, tokens_out, model_calls, tool_calls)`` records
    how the run ended; an exception leaving the block ends it in error."""
    otel = _process_otel()
    if otel is None:
        return OFF
    return otel.invoke_agent(
        carried, person_turn=person_turn, execution_id=execution_id, session_id=session_id,
        name=_cut(agent_name), attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": _cut(agent_name),
            "gen_ai.agent.id": branch_id,
            "gen_ai.conversation.id": session_id,
            "gen_ai.provider.name": provider or "scripted",
            "gen_ai.request.model": model,
            "trellis.execution.id": execution_id,
            "trellis.execution.kind": kind,
            "trellis.branch.id": branch_id,
            "trellis.agent_id": spec_agent_id,
        })


def chat(*, provider: str, model: str, execution_id: str, session_id: str):
    """The span of one model call of the current turn (``chat {model}``); the handle's
    ``answered(tokens_in, tokens_out, tool_calls)`` records what the model reported."""
    if not ENABLED:
        return OFF
    parent = _current.get()
    if parent is None:  # a model call outside a traced turn (a branch's naming)
        return OFF
    return parent.child(f"chat {_cut(model)}" if model else "chat", client=True, attributes={
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider or "scripted",
        "gen_ai.request.model": _cut(model),
        "gen_ai.conversation.id": session_id,
        "trellis.execution.id": execution_id,
    })


def execute_tool(*, name: str, call_id: str, execution_id: str, session_id: str):
    """The span of one tool call of the current turn (``execute_tool {tool}``), current while the
    tool runs (a job it admits joins the trace under it); the handle's
    ``returned(is_error, code)`` records a refusal or failure."""
    if not ENABLED:
        return OFF
    parent = _current.get()
    if parent is None:
        return OFF
    return parent.child(f"execute_tool {_cut(name)}", client=False, attributes={
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": _cut(name),
        "gen_ai.tool.call.id": _cut(call_id),
        "gen_ai.tool.type": "function",
        "gen_ai.conversation.id": session_id,
        "trellis.execution.id": execution_id,
    })


def start() -> None:
    """Build this process's tracer provider now (a worker at its start), so its first turn does
    not wait for the SDK to load. Nothing while tracing is off."""
    _process_otel()


def _process_otel():
    """This process's ``_Otel``, built on first use; None while tracing is off, or in a process
    where it could not be built (logged once): its turns then run untraced, never failed by it."""
    global ENABLED
    if not ENABLED:
        return None
    try:
        return _otel()
    except Exception:
        ENABLED = False
        log.exception("traces are off in this process: the OpenTelemetry SDK could not be set up")
        return None


def _cut(text) -> str:
    return str(text or "")[:MAX_NAME]


class _Span:
    """One started span of ours: ``with`` makes it current in this thread (and in OpenTelemetry's
    context, for any other instrumentation) and ends it, in error when an exception leaves the
    block (``error.type``: the exception's ``code``, else its class)."""

    __slots__ = ("otel", "span", "root", "_tokens")

    def __init__(self, otel, span, root: str):
        self.otel, self.span, self.root = otel, span, root
        self._tokens = None

    def __enter__(self):
        otel = self.otel
        self._tokens = (_current.set(self), otel.context.attach(otel.trace.set_span_in_context(self.span)))
        return self

    def __exit__(self, kind, exc, tb):
        try:
            if exc is not None:
                self.failed(str(getattr(exc, "code", "") or type(exc).__name__))
        finally:
            ours, theirs = self._tokens
            self.otel.context.detach(theirs)
            _current.reset(ours)
            self.span.end()
            if self.otel.exiting:  # the process is on its way out: no batch will come for this span
                self.otel.provider.force_flush(EXIT_FLUSH_MILLIS)
        return False

    def child(self, name: str, *, client: bool, attributes: dict) -> "_Span":
        return self.otel.child(self, name, client=client, attributes=attributes)

    def carried(self) -> str:
        return self.otel.carried(self.span.get_span_context(), self.root)

    def failed(self, error_type: str) -> None:
        self.span.set_attribute("error.type", error_type)
        self.span.set_status(self.otel.Status(self.otel.StatusCode.ERROR, error_type))

    def answered(self, *, tokens_in: int, tokens_out: int, tool_calls: bool) -> None:
        self.span.set_attributes({
            "gen_ai.usage.input_tokens": int(tokens_in),
            "gen_ai.usage.output_tokens": int(tokens_out),
            "gen_ai.response.finish_reasons": ["tool_calls" if tool_calls else "stop"],
        })

    def returned(self, *, is_error: bool, code: str = "") -> None:
        if is_error:
            self.failed(code or "tool_error")

    def ended(self, *, status: str, error_code: str, tokens_in: int, tokens_out: int, model_calls: int,
              tool_calls: int) -> None:
        self.span.set_attributes({
            "trellis.execution.status": status,
            "gen_ai.usage.input_tokens": int(tokens_in),
            "gen_ai.usage.output_tokens": int(tokens_out),
            "trellis.model_calls": int(model_calls),
            "trellis.tool_calls": int(tool_calls),
        })
        if status in ENDED_IN_ERROR:
            self.failed(error_code or status)


class _Otel:
    """This process's OpenTelemetry: the SDK's modules, one tracer provider with a batch span
    processor and the OTLP/HTTP exporter (configured by the standard ``OTEL_*`` variables), and its
    tracer. Its provider is never made the process's global one: other libraries' instrumentation
    is left as it was."""

    def __init__(self):
        # lazy: the OpenTelemetry SDK, its exporter and protobuf load only in a process that traces
        from opentelemetry import context, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self.context, self.trace = context, trace
        self.Status, self.StatusCode = trace.Status, trace.StatusCode
        self.TraceState = trace.TraceState
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        self.ids = _pinnable_ids(RandomIdGenerator)()
        self.provider = TracerProvider(resource=resource, id_generator=self.ids)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer(SCOPE, schema_url=SCHEMA_URL)
        self.exiting = False
        # a django-q2 worker ends through multiprocessing, which runs its finalizers and never the
        # atexit handlers (the provider's own shutdown): the spans still queued go out here, and
        # those of turns that end after it (their slot threads are joined later) at their end
        multiprocessing_util.Finalize(None, self.flush_at_exit, exitpriority=10)

    def flush_at_exit(self) -> None:
        self.exiting = True
        self.provider.force_flush(EXIT_FLUSH_MILLIS)

    def invoke_agent(self, carried: str, *, person_turn: bool, execution_id: str, session_id: str, name: str,
                     attributes: dict) -> _Span:
        parent, root = self.parent_of(carried)
        if person_turn or not root:
            root = session_id
        attributes["trellis.root_session.id"] = root
        base = self.context.Context()  # the job's context alone, never the thread's (an inline child's caller)
        context = self.trace.set_span_in_context(self.trace.NonRecordingSpan(parent), base) if parent else base
        self.ids.pin(None if parent else trace_id_of(execution_id))
        try:
            span = self.tracer.start_span(f"invoke_agent {name}" if name else "invoke_agent", context=context,
                                          kind=self.trace.SpanKind.INTERNAL, attributes=_present(attributes),
                                          record_exception=False, set_status_on_exception=False)
        finally:
            self.ids.pin(None)
        return _Span(self, span, root)

    def child(self, parent: _Span, name: str, *, client: bool, attributes: dict) -> _Span:
        kind = self.trace.SpanKind.CLIENT if client else self.trace.SpanKind.INTERNAL
        span = self.tracer.start_span(name, context=self.trace.set_span_in_context(parent.span, self.context.Context()),
                                      kind=kind, attributes=_present(attributes),
                                      record_exception=False, set_status_on_exception=False)
        return _Span(self, span, parent.root)

    def parent_of(self, carried: str):
        """The span context a job's ``trace_context`` names (None: none, or not one Trellis wrote)
        and the root session id its tracestate carries."""
        head, _, state = (carried or "").partition(";")
        match = _TRACEPARENT.fullmatch(head.strip())
        if match is None:
            return None, None
        trace_id, span_id, flags = int(match[1], 16), int(match[2], 16), int(match[3], 16)
        if not trace_id or not span_id:
            return None, None
        trace_state = self.TraceState.from_header([state]) if state else self.TraceState()
        parent = self.trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=self.trace.TraceFlags(flags),
                                        trace_state=trace_state)
        return parent, trace_state.get(STATE_KEY)

    def carried(self, span_context, root: str) -> str:
        """``traceparent;tracestate`` of ``span_context``, its tracestate led by the root session's
        id, within ``MAX_CONTEXT`` (other vendors' members dropped from the end if need be)."""
        if not span_context.is_valid:
            return ""
        head = f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"
        state = span_context.trace_state.delete(STATE_KEY) if STATE_KEY in span_context.trace_state \
            else span_context.trace_state
        state = state.add(STATE_KEY, root) if root else state
        header = state.to_header()
        while header and len(head) + 1 + len(header) > MAX_CONTEXT:
            others = [key for key in state.keys() if key != STATE_KEY]
            state = state.delete(others[-1]) if others else self.TraceState()
            header = state.to_header()
        return f"{head};{header}" if header else head


def _present(attributes: dict) -> dict:
    return {key: value for key, value in attributes.items() if value is not None and value != ""}


def _pinnable_ids(base):
    """The SDK's random ids, but for a trace id pinned on this thread for the span about to start
    (``pin``): the derived id of a trace that starts with a job (``trace_id_of``)."""

    class PinnableIds(base):
        def __init__(self):
            self._pinned = threading.local()

        def pin(self, trace_id: int | None) -> None:
            self._pinned.trace_id = trace_id

        def generate_trace_id(self) -> int:
            pinned = getattr(self._pinned, "trace_id", None)
            return super().generate_trace_id() if pinned is None else pinned

        def is_trace_id_random(self) -> bool:
            # a derived id is a hash of the execution's random id, not fresh randomness (W3C's random flag)
            return getattr(self._pinned, "trace_id", None) is None

    return PinnableIds


_otel = PerProcess(_Otel)

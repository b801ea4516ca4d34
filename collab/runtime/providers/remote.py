"""What the SDK-backed providers (``openai``, ``anthropic``) share: the model connection,
the API key, options, bounded retries with backoff, errors as ``ProviderError``, cost, and
secrecy.

Endpoint and key come ONLY from the spec's operator-owned ``ModelConnection``
(docs/contract.md#authorization-and-visibility): before every model call the connection is read
fresh and checked against the spec's project, provider and model (services/connections.py; a
binding may have changed since the spec was saved), else the call ends with ``provider_config`` and
no request leaves the worker. The key is read at call time from the worker variable the connection
names and is never stored, logged, put in an event or in an error reason. The SDK clients never
follow redirects and are given every setting explicitly (no SDK environment fallbacks). Error
reasons name the connection, the HTTP status and the error class, never text from the remote host
(which is only logged, scrubbed of the key).

Per-spec model options live in ``AgentSpec.limits`` (all optional):
``stream`` (default true), ``max_tokens``, ``temperature``, ``timeout_seconds``,
``max_retries``. Defaults come from settings (``TRELLIS_MODEL_*``).

While streaming, each text fragment is also handed to ``turn.on_text_delta(text)``
when the turn context has one (the hook for streaming tokens to the page). A
call retried after a broken stream starts its text over.
"""

import logging
import os
import random
import socket
import threading
import time
from contextlib import nullcontext
from decimal import Decimal

import httpx2
from django.conf import settings
from django.db import transaction

from collab.errors import Invalid
from collab.events import send_event_on_commit
from collab.runtime.providers.base import ProviderError
from collab.runtime.providers.mapping import clean_title
from collab.services.connections import check_spec_connection
from collab.infra.per_process import PerProcess

log = logging.getLogger(__name__)

MAX_RETRY_DELAY = 30.0
MAX_REASON_CHARS = 300
KEYLESS = "no-key"  # what a keyless connection (a local server) sends; the SDKs require some key
TITLE_RETRIES = 1

# The TLS context of this process's model calls: the one the SDKs' HTTP client builds when given
# none (certificates and host names verified against the default CA bundle, ``SSL_CERT_FILE`` /
# ``SSL_CERT_DIR`` honoured), built once per process instead of once per call. Building it loads
# the CA bundle — ~20 ms of CPU and ~1 MB — which every model call paid while a new client per
# call built its own. Threads share it safely; a forked process builds its own.
verified_tls = PerProcess(httpx2.create_ssl_context)


# Headers a model request may carry besides the connection's key (all set by the SDKs).
SAFE_HEADERS = frozenset({
    "host", "accept", "accept-encoding", "connection", "content-type", "content-length", "user-agent",
    "anthropic-version", "anthropic-beta", "idempotency-key",
})


class OffConnection(Exception):
    """A request was about to leave for a host that is not the connection's."""


class Failure:
    """One failed attempt, classified: may it be retried, and how does the job end if not."""

    def __init__(self, code: str, reason: str, retryable: bool, status: int | None = None, retry_after: float | None = None):
        self.code, self.reason, self.retryable, self.status, self.retry_after = code, reason, retryable, status, retry_after


class RemoteProvider:
    """Base of the SDK providers. Subclasses set ``name``, ``sdk`` (the SDK module) and
    ``official_base_url``, and implement ``_client(key, http_client)``, ``_complete(client, turn)``
    and ``_title(client, messages)``."""

    name = ""
    sdk = None
    official_base_url = ""

    def __init__(self, spec):
        self.spec = spec
        self.model = getattr(spec, "model", "") or ""
        self.options = getattr(spec, "limits", None) or {}
        if not isinstance(self.options, dict):
            self.options = {}
        self.connection = None
        self._key = ""

    # --- options -------------------------------------------------------------------------

    def option(self, name: str, default, kind=None):
        """A model option from ``AgentSpec.limits`` (``default`` when absent), as ``kind``;
        a value of the wrong type ends the turn with a readable reason, not a crash."""
        value = self.options.get(name)
        if value is None:
            return default
        if kind is None:
            return value
        if kind is bool:
            if isinstance(value, bool):
                return value
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return kind(value)
        raise ProviderError(
            f"agent spec option limits.{name} must be {'true or false' if kind is bool else 'a non-negative number'}; "
            f"got {value!r}", code="provider_config",
        )

    @property
    def timeout(self) -> float:
        return max(0.1, self.option("timeout_seconds", float(settings.TRELLIS_MODEL_TIMEOUT), float))

    @property
    def max_retries(self) -> int:
        return self.option("max_retries", settings.TRELLIS_MODEL_RETRIES, int)

    @property
    def stream(self) -> bool:
        return self.option("stream", True, bool)

    @property
    def max_tokens(self) -> int | None:
        value = self.option("max_tokens", None, int)
        return value or None

    @property
    def temperature(self) -> float | None:
        return self.option("temperature", None, float)

    @property
    def endpoint(self) -> str:
        """Where requests go, for reasons and logs: the connection's name (no URL, no key)."""
        return f"connection {self.connection.name!r}" if self.connection is not None else f"the {self.name} provider"

    @property
    def base_url(self) -> str:
        return (self.connection.base_url if self.connection is not None else "") or self.official_base_url

    # --- the connection and its key --------------------------------------------------------

    def connect(self) -> None:
        """Read the spec's connection now and check it still serves this spec."""
        try:
            self.connection = check_spec_connection(self.spec)
        except Invalid as exc:
            raise ProviderError(exc.detail, code="provider_config") from None

    def api_key(self) -> str:
        """The connection's key from the worker environment, read now (never cached across
        calls, never stored); a keyless connection sends a fixed placeholder."""
        env = self.connection.key_env
        self._key = ""
        if not env:
            return KEYLESS  # the SDKs insist on a key; guard_request sends none
        key = os.environ.get(env, "").strip()
        if not key:
            raise ProviderError(
                f"the key of {self.endpoint} (environment variable {env!r}) is not set on this worker",
                code="provider_auth",
            )
        self._key = key
        return key

    def http_client(self, sockets: "CallSockets | None" = None):
        """The HTTP client the SDK uses: the SDK's defaults, except that redirects are never
        followed (a 3xx answer ends the call with ``provider_error``), every request passes
        ``guard_request`` and its TLS context is the process's (``verified_tls``); with ``sockets``, the sockets its requests open are kept there, so a
        stop request can shut them down (``CallSockets``)."""
        hooks = [self.guard_request] if sockets is None else [self.guard_request, sockets.watch]
        return self.sdk.DefaultHttpxClient(follow_redirects=False, event_hooks={"request": hooks},
                                           verify=verified_tls())

    def guard_request(self, request) -> None:
        """The one place that decides what leaves the worker: a request goes only to the
        connection's origin and carries only the allow-listed headers plus this connection's
        key. Whatever an SDK would add from the environment (other keys, ``*_CUSTOM_HEADERS``,
        organisation ids) is dropped."""
        base = httpx2.URL(self.base_url)
        if (request.url.scheme, request.url.host, request.url.port) != (base.scheme, base.host, base.port):
            raise OffConnection(f"a request to another origin than {self.endpoint}")
        for name in list(request.headers.keys()):
            lower = name.lower()
            if lower not in SAFE_HEADERS and not lower.startswith("x-stainless-"):
                del request.headers[name]
        if self._key:
            request.headers["Authorization"] = f"Bearer {self._key}"

    def scrub(self, text: str) -> str:
        text = str(text or "")
        if self._key and len(self._key) >= 4:
            text = text.replace(self._key, "[redacted]")
        return text

    # --- the interface -------------------------------------------------------------------

    def complete(self, turn):
        return self.call(lambda client: self._complete(client, turn), turn=turn, retries=self.max_retries)

    def title(self, messages) -> str:
        """A short title (≤ 8 words) for branch naming stage 2; any failure is a ``ProviderError``
        (naming then keeps the current name)."""
        try:
            answer = self.call(lambda client: self._title(client, messages), turn=None,
                               retries=min(self.max_retries, TITLE_RETRIES))
        except ProviderError:
            raise
        except Exception as exc:  # an answer of an unexpected shape must not crash the naming task
            raise ProviderError(f"unexpected title answer from {self.endpoint}: {type(exc).__name__}") from None
        return clean_title(answer)

    # --- retries -------------------------------------------------------------------------

    def call(self, attempt, *, turn, retries: int):
        """Run ``attempt(client)`` with up to ``retries`` retries on 429, 5xx, timeouts and
        connection errors (exponential backoff with jitter, honouring ``Retry-After``).
        Each retry is logged and, in a turn, recorded as a ``model.retry`` event. A stop
        request during the backoff ends the wait at once (``turn.sleep``)."""
        self.connect()
        key = self.api_key()
        tries = 0
        while True:
            sockets = CallSockets()
            client = self._client(key, self.http_client(sockets))
            aborting = getattr(turn, "aborting", None)
            try:
                # a stop request shuts the call's sockets down from the stop watch's thread: the
                # request in flight (streaming or not) ends at once, and nothing more is read
                with aborting(sockets.shut_down) if aborting is not None else nullcontext():
                    return attempt(client)
            except Exception as exc:
                if turn is not None and hasattr(turn, "raise_if_stopped"):
                    turn.raise_if_stopped()  # aborted by a stop: the turn ends cancelled, no retry
                if not isinstance(exc, (self.sdk.APIError, httpx2.TransportError, OffConnection)):
                    raise
                failure = self.classify(exc)
            finally:
                client.close()
            if not failure.retryable or tries >= retries:
                suffix = f" (gave up after {tries} {'retry' if tries == 1 else 'retries'})" if tries else ""
                log.warning("%s model call failed: %s%s", self.name, failure.reason, suffix)
                raise ProviderError(failure.reason + suffix, code=failure.code)
            tries += 1
            delay = self.backoff(tries, failure.retry_after)
            log.warning("%s model call failed (%s); retry %d of %d in %.2fs", self.name, failure.reason, tries, retries, delay)
            if turn is not None:
                record_retry(turn, provider=self.name, attempt=tries, retries=retries, failure=failure, delay=delay)
                turn.sleep(delay)
            else:
                time.sleep(delay)

    @staticmethod
    def backoff(tries: int, retry_after: float | None) -> float:
        base = settings.TRELLIS_MODEL_RETRY_BASE_MS / 1000
        delay = min(MAX_RETRY_DELAY, base * (2 ** (tries - 1)))
        delay = delay * (0.75 + random.random() / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, MAX_RETRY_DELAY))
        return delay

    def classify(self, exc) -> Failure:
        """The failure's code and reason: the connection, the HTTP status and the error class,
        never text from the remote host (that is only logged, scrubbed of the key)."""
        sdk = self.sdk
        detail = self.scrub(error_detail(exc))
        if detail:
            log.info("%s: %s said: %s", self.name, self.endpoint, detail)
        off = next((e for e in (exc, exc.__cause__, exc.__context__) if isinstance(e, OffConnection)), None)
        if off is not None:
            return Failure("provider_config", f"refused {off}", False)
        if isinstance(exc, (sdk.APITimeoutError, httpx2.TimeoutException)):
            return Failure("provider_timeout", f"{self.endpoint} did not answer within {self.timeout:g} s", True)
        if isinstance(exc, (sdk.APIConnectionError, httpx2.TransportError)):
            return Failure("provider_unreachable", f"could not reach {self.endpoint} (connection error)", True)
        if isinstance(exc, sdk.APIStatusError):
            status = exc.status_code
            if 300 <= status < 400:
                return Failure("provider_error", f"{self.endpoint} answered with a redirect (HTTP {status}), "
                                                 "which is not followed", False, status)
            if status in (401, 403):
                return Failure("provider_auth", f"{self.endpoint} refused the API key from "
                                                f"{self.connection.key_env!r} (HTTP {status})", False, status)
            if status == 429:
                return Failure("provider_rate_limited", f"{self.endpoint} is rate limiting (HTTP 429)", True, status,
                               retry_after(exc))
            if status in (408, 409) or status >= 500:
                return Failure("provider_error", f"{self.endpoint} failed (HTTP {status})", True, status, retry_after(exc))
            if status == 404:
                return Failure("provider_error", f"{self.endpoint} has no model {self.model!r} or no such endpoint "
                                                 "(HTTP 404)", False, status)
            return Failure("provider_error", f"{self.endpoint} rejected the request (HTTP {status})", False, status)
        return Failure("provider_error", f"unexpected answer from {self.endpoint} ({type(exc).__name__})", False)

    # --- accounting ----------------------------------------------------------------------

    def cost(self, tokens_in: int, tokens_out: int) -> Decimal:
        overrides = self.connection.prices if self.connection is not None else None
        return model_cost(self.model, tokens_in, tokens_out, overrides=overrides)


class CallSockets:
    """The sockets one model call's requests open, so that a stop request can end the call from
    another thread: closing an HTTP client there does not wake a thread blocked reading its
    socket (the read goes on until the model answers or the timeout), a socket's ``shutdown``
    does. The sockets are seen through httpcore's ``trace`` request extension (public: set on
    each request by ``watch``, an httpx request hook): each new connection reports the network
    stream it opened, and the stream gives its socket (``get_extra_info("socket")``)."""

    TRACED = ("connection.connect_tcp.complete", "connection.start_tls.complete")

    def __init__(self):
        self._lock = threading.Lock()
        self._sockets: list = []
        self._shut = False

    def watch(self, request) -> None:
        request.extensions["trace"] = self._trace

    def _trace(self, name: str, info: dict) -> None:
        if name not in self.TRACED:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            shut = self._shut
        if shut:  # the stop came while this connection was being opened
            _shut_down(sock)

    def shut_down(self) -> None:
        with self._lock:
            self._shut = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut_down(sock)


def _shut_down(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or never connected: nothing more to end
        pass


def error_detail(exc) -> str:
    """The provider's own error message, if its body has one (``{"error": {"message"}}``)."""
    body = getattr(exc, "body", None)
    message = ""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = err.get("message") or ""
        elif isinstance(err, str):
            message = err
    if not message:
        message = getattr(exc, "message", "") or ""
    message = " ".join(str(message).split())
    return message[:MAX_REASON_CHARS]


def retry_after(exc) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000
        if headers.get("retry-after"):
            return float(headers["retry-after"])
    except (TypeError, ValueError):
        return None
    return None


def record_retry(turn, *, provider: str, attempt: int, retries: int, failure: Failure, delay: float) -> None:
    payload = {
        "job": turn.job.pk,
        "branch": turn.branch.pk,
        "provider": provider,
        "attempt": attempt,
        "max_retries": retries,
        "status": failure.status,
        "code": failure.code,
        "reason": failure.reason,
        "delay_ms": int(delay * 1000),
    }
    with transaction.atomic():
        send_event_on_commit(turn.job.session_id, "model.retry", payload)


# Model → (input $/Mtok, output $/Mtok); the operator's ``TRELLIS_MODEL_PRICES`` adds to and
# overrides these (``price_table``).
BUILTIN_PRICES = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
    "o4-mini": (1.10, 4.40),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4": (1.00, 5.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-opus-4-5": (5.00, 25.00),
}


def price_table() -> dict:
    """The built-in prices with the operator's (``settings.TRELLIS_MODEL_PRICES``) over them."""
    return {**BUILTIN_PRICES, **(getattr(settings, "TRELLIS_MODEL_PRICES", {}) or {})}


def model_price(model: str, overrides: dict | None = None) -> tuple[Decimal, Decimal] | None:
    """(input, output) $ per million tokens: from the connection's ``prices`` if it lists the
    model, else ``price_table()``; in each, the exact model, else the longest name the model
    starts with (``gpt-4o-2024-08-06`` → ``gpt-4o``); None if unknown."""
    for prices in (overrides or {}, price_table()):
        if model in prices:
            found = prices[model]
        else:
            candidates = [name for name in prices if model.startswith(name)]
            if not candidates:
                continue
            found = prices[max(candidates, key=len)]
        return Decimal(str(found[0])), Decimal(str(found[1]))
    return None


def model_cost(model: str, tokens_in: int, tokens_out: int, overrides: dict | None = None) -> Decimal:
    price = model_price(model, overrides)
    if price is None:
        return Decimal(0)
    return (price[0] * tokens_in + price[1] * tokens_out) / Decimal(1_000_000)

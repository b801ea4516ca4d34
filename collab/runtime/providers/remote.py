"""What the SDK-backed providers (``openai``, ``anthropic``) share: the API key, options,
bounded retries with backoff, errors as ``ProviderError``, cost, and secrecy.

Keys are read at call time from the worker environment variable that
``AgentSpec.api_key_env`` names; they are never stored, logged, put in an event
or in an error reason (any text from the provider is scrubbed of the key first).

Per-spec model options live in ``AgentSpec.limits`` (all optional):
``stream`` (default true), ``max_tokens``, ``temperature``, ``timeout_seconds``,
``max_retries``. Defaults come from settings (``TRELLIS_MODEL_*``).

While streaming, each text fragment is also handed to ``ctx.on_text_delta(text)``
when the turn context has one (the hook for streaming tokens to the page). A
call retried after a broken stream starts its text over.
"""

import logging
import os
import random
import time
from decimal import Decimal
from urllib.parse import urlsplit

import httpx2
from django.conf import settings
from django.db import transaction

from collab.runtime.providers.base import ProviderError

log = logging.getLogger(__name__)

MAX_RETRY_DELAY = 30.0
MAX_REASON_CHARS = 300
TITLE_RETRIES = 1


class Failure:
    """One failed attempt, classified: may it be retried, and how does the job end if not."""

    def __init__(self, code: str, reason: str, retryable: bool, status: int | None = None, retry_after: float | None = None):
        self.code, self.reason, self.retryable, self.status, self.retry_after = code, reason, retryable, status, retry_after


class RemoteProvider:
    """Base of the SDK providers. Subclasses set ``name``, ``sdk`` (the SDK module),
    ``default_key_env``, and implement ``_client(key)``, ``_complete(client, ctx)`` and
    ``_title(client, messages)``."""

    name = ""
    sdk = None
    default_key_env = ""

    def __init__(self, spec):
        self.spec = spec
        self.model = getattr(spec, "model", "") or ""
        self.base_url = (getattr(spec, "base_url", "") or "").strip() or None
        self.options = getattr(spec, "limits", None) or {}
        if not isinstance(self.options, dict):
            self.options = {}
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
        """Where requests go, for reasons and logs: scheme, host and port only (no credentials in URLs)."""
        if not self.base_url:
            return f"the {self.name} API"
        parts = urlsplit(self.base_url)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}"

    # --- the key -------------------------------------------------------------------------

    def api_key(self) -> str:
        """The key from the environment, read now (never cached across calls, never stored)."""
        named = (getattr(self.spec, "api_key_env", "") or "").strip()
        env = named or self.default_key_env
        if not key_env_allowed(env):
            raise ProviderError(f"api_key_env {env!r} is not an allowed key variable on this server", code="provider_config")
        key = os.environ.get(env, "").strip()
        if not key:
            if not named and self.base_url:
                return "unused"  # a local OpenAI-compatible server that needs no key
            raise ProviderError(
                f"the environment variable {env!r} (api_key_env) is not set on this worker", code="provider_auth"
            )
        self._key = key
        return key

    def scrub(self, text: str) -> str:
        text = str(text or "")
        if self._key and len(self._key) >= 4:
            text = text.replace(self._key, "[redacted]")
        return text

    # --- the interface -------------------------------------------------------------------

    def complete(self, ctx):
        return self.call(lambda client: self._complete(client, ctx), ctx=ctx, retries=self.max_retries)

    def title(self, messages) -> str:
        """A short title (≤ 8 words) for branch naming stage 2; any failure is a ``ProviderError``
        (naming then keeps the current name)."""
        from collab.runtime.providers.mapping import clean_title

        try:
            answer = self.call(lambda client: self._title(client, messages), ctx=None,
                               retries=min(self.max_retries, TITLE_RETRIES))
        except ProviderError:
            raise
        except Exception as exc:  # an answer of an unexpected shape must not crash the naming task
            raise ProviderError(f"unexpected title answer from {self.endpoint}: {type(exc).__name__}") from None
        return clean_title(answer)

    # --- retries -------------------------------------------------------------------------

    def call(self, attempt, *, ctx, retries: int):
        """Run ``attempt(client)`` with up to ``retries`` retries on 429, 5xx, timeouts and
        connection errors (exponential backoff with jitter, honouring ``Retry-After``).
        Each retry is logged and, in a turn, recorded as a ``model.retry`` event. A stop
        request during the backoff ends the wait at once (``ctx.sleep``)."""
        key = self.api_key()
        tries = 0
        while True:
            client = self._client(key)
            try:
                return attempt(client)
            except (self.sdk.APIError, httpx2.TransportError) as exc:
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
            if ctx is not None:
                record_retry(ctx, provider=self.name, attempt=tries, retries=retries, failure=failure, delay=delay)
                ctx.sleep(delay)
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
        sdk = self.sdk
        if isinstance(exc, (sdk.APITimeoutError, httpx2.TimeoutException)):
            return Failure("provider_timeout", f"{self.endpoint} did not answer within {self.timeout:g} s", True)
        if isinstance(exc, (sdk.APIConnectionError, httpx2.TransportError)):
            return Failure("provider_unreachable", f"could not reach {self.endpoint} (connection error)", True)
        if isinstance(exc, sdk.APIStatusError):
            status = exc.status_code
            detail = self.scrub(error_detail(exc))
            said = f": {detail}" if detail else ""
            if status in (401, 403):
                env = (getattr(self.spec, "api_key_env", "") or self.default_key_env)
                return Failure("provider_auth", f"{self.endpoint} refused the API key from {env!r} (HTTP {status}){said}", False, status)
            if status == 429:
                return Failure("provider_rate_limited", f"{self.endpoint} is rate limiting (HTTP 429){said}", True, status, retry_after(exc))
            if status in (408, 409) or status >= 500:
                return Failure("provider_error", f"{self.endpoint} failed (HTTP {status}){said}", True, status, retry_after(exc))
            if status == 404:
                return Failure("provider_error", f"{self.endpoint} has no model {self.model!r} or no such endpoint (HTTP 404){said}", False, status)
            return Failure("provider_error", f"{self.endpoint} rejected the request (HTTP {status}){said}", False, status)
        detail = self.scrub(getattr(exc, "message", "") or str(exc))[:MAX_REASON_CHARS]
        return Failure("provider_error", f"unexpected answer from {self.endpoint}: {detail or type(exc).__name__}", False)

    # --- accounting ----------------------------------------------------------------------

    def cost(self, tokens_in: int, tokens_out: int) -> Decimal:
        return model_cost(self.model, tokens_in, tokens_out)


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


def record_retry(ctx, *, provider: str, attempt: int, retries: int, failure: Failure, delay: float) -> None:
    from collab.events import send_event_on_commit

    payload = {
        "job": ctx.job.pk,
        "branch": ctx.branch.pk,
        "provider": provider,
        "attempt": attempt,
        "max_retries": retries,
        "status": failure.status,
        "code": failure.code,
        "reason": failure.reason,
        "delay_ms": int(delay * 1000),
    }
    with transaction.atomic():
        send_event_on_commit(ctx.job.session_id, "model.retry", payload)


def model_price(model: str) -> tuple[Decimal, Decimal] | None:
    """(input, output) $ per million tokens: the exact model, else the longest price-table
    name the model starts with (``gpt-4o-2024-08-06`` → ``gpt-4o``); None if unknown."""
    prices = getattr(settings, "TRELLIS_MODEL_PRICES", {}) or {}
    if model in prices:
        found = prices[model]
    else:
        candidates = [name for name in prices if model.startswith(name)]
        if not candidates:
            return None
        found = prices[max(candidates, key=len)]
    return Decimal(str(found[0])), Decimal(str(found[1]))


def model_cost(model: str, tokens_in: int, tokens_out: int) -> Decimal:
    price = model_price(model)
    if price is None:
        return Decimal(0)
    return (price[0] * tokens_in + price[1] * tokens_out) / Decimal(1_000_000)


def key_env_allowed(name: str) -> bool:
    """Only variables that look like model keys may be read for a spec: a spec's author must
    not be able to send the server's own secrets (DJANGO_SECRET_KEY, DATABASE_URL…) to a
    base_url of their choosing. The pattern is settings.TRELLIS_API_KEY_ENV_PATTERN."""
    import re

    from django.conf import settings

    return bool(re.fullmatch(settings.TRELLIS_API_KEY_ENV_PATTERN, name or ""))

"""Whether this process exports traces (docs/operations.md#traces), from the standard
OpenTelemetry variables: on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, unless
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Everything else the exporter reads
itself (``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*`` …); what Trellis
cannot honour stops the process at start-up, naming the variable."""

from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from collab.conf.env import env_str

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
HTTP_PROTOCOL = "http/protobuf"  # the one OTLP transport Trellis ships (opentelemetry-exporter-otlp-proto-http)


def traces_from_env() -> bool:
    """True when this process should export its spans over OTLP/HTTP."""
    endpoint = env_str(ENDPOINT)
    if not endpoint or env_str("OTEL_SDK_DISABLED").lower() == "true":
        return False
    exporter = env_str("OTEL_TRACES_EXPORTER", "otlp").lower()
    if exporter == "none":
        return False
    if exporter != "otlp":
        raise ImproperlyConfigured(f"OTEL_TRACES_EXPORTER must be otlp or none, got {exporter!r}")
    for name in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        protocol = env_str(name, HTTP_PROTOCOL)
        if protocol != HTTP_PROTOCOL:
            raise ImproperlyConfigured(f"{name} must be {HTTP_PROTOCOL} (Trellis exports OTLP over HTTP), got {protocol!r}")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"{ENDPOINT} must be an http:// or https:// URL, got {endpoint!r}")
    return True

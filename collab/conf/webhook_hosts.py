"""``TRELLIS_WEBHOOK_HOSTS``: the hosts project webhooks may call, and the one URL check.

Project owners are untrusted tenants (docs/security.md#who-is-trusted): a webhook URL is accepted — when it is
registered, and again before every attempt — only if its host is on the operator's list. The
variable is comma-separated; each entry is a host, optionally with a port::

    hooks.slack.com        that host on the scheme's default port (443 for https, 80 for http)
    ci.example.com:8443    that host on port 8443 only
    10.0.0.7:*             that host on any port
    [fd00::7]:9000         an IPv6 address, in brackets

Hosts match exactly: case-insensitive, IDNA-encoded, without a trailing dot; there are no
wildcards (list each host). An entry with a scheme, a path, credentials or a bad port stops
the process at start-up (``ImproperlyConfigured``). Empty = webhooks cannot be registered.

A host listed by name is looked up when a request is sent and the request goes to the
address found then (``collab.outbound``); a name that resolves to an address that is not
globally routable (loopback, private, link-local, unique-local, reserved …) or to a cloud
metadata address is refused — list the address itself to reach one.
"""

import ipaddress
import os
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from django.core.exceptions import ImproperlyConfigured

ANY_PORT = "*"
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL_LENGTH = 2000

# A URL the checks below accept as written, whatever the host list says (the API publishes
# it): http(s), a host name or IPv4 address of up to 7 labels of up to 31 letters, digits or
# hyphens, an optional port 1-65535, then a path or query without spaces, control characters
# or a fragment. A subset of what ``check_webhook_url`` reads (it also takes longer names,
# IPv6 and a trailing dot); the host must still be on the operator's list.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,29}[A-Za-z0-9])?"
_PORT = r"(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?"
URL_PATTERN = rf"^[Hh][Tt][Tt][Pp][Ss]?://{_LABEL}(?:\.{_LABEL}){{0,6}}{_PORT}(?:[/?][^\x00-\x20\x7f-\x9f#]*)?$"


@dataclass(frozen=True)
class HostRule:
    """One approved host: ``port`` None = the scheme's default port, ``ANY_PORT`` = any."""

    host: str
    port: int | str | None = None

    def allows(self, host: str, port: int, scheme: str) -> bool:
        if host != self.host:
            return False
        if self.port == ANY_PORT:
            return True
        return port == (DEFAULT_PORTS[scheme] if self.port is None else self.port)


@dataclass(frozen=True)
class WebhookTarget:
    """A checked webhook URL, split into what a pinned request needs."""

    scheme: str
    host: str  # normalized; an IPv6 address without brackets
    port: int
    target: str  # path and query, at least "/"
    is_address: bool  # the host is an IP address (nothing to look up)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


class WebhookUrlError(ValueError):
    """Why a URL cannot be a webhook: ``code`` for the API, ``detail`` for people."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code, self.detail = code, detail


def normalize_host(host: str) -> tuple[str, bool]:
    """(the host as rules compare it, whether it is an IP address); ValueError if it is not a host."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError("empty host")
    try:
        return ipaddress.ip_address(host).compressed, True
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError(f"{host!r} is not a valid host name") from None
    labels = ascii_host.split(".")
    if any(not label or len(label) > 63 or not all(c.isalnum() or c == "-" for c in label)
           or label.startswith("-") or label.endswith("-") for label in labels) or len(ascii_host) > 253:
        raise ValueError(f"{host!r} is not a valid host name")
    return ascii_host, False


def _rule(entry: str, var: str) -> HostRule:
    where = f"{var} entry {entry!r}"
    if "/" in entry or "@" in entry or "?" in entry or "#" in entry:
        raise ImproperlyConfigured(f"{where}: list a host or host:port only (no scheme, path or credentials)")
    if entry.startswith("["):
        end = entry.find("]")
        if end < 0:
            raise ImproperlyConfigured(f"{where}: an IPv6 address needs its closing bracket")
        host, rest = entry[: end + 1], entry[end + 1:]
        if rest and not rest.startswith(":"):
            raise ImproperlyConfigured(f"{where}: expected [address]:port")
        port = rest[1:] if rest else None
    elif entry.count(":") > 1:
        raise ImproperlyConfigured(f"{where}: write an IPv6 address in brackets, e.g. [fd00::7]:9000")
    else:
        host, sep, port = entry.partition(":")
        port = port if sep else None
    if "*" in host:
        raise ImproperlyConfigured(f"{where}: wildcards are not supported; list each host")
    try:
        host, _ = normalize_host(host)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from None
    if port is None or port == ANY_PORT:
        return HostRule(host, port)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ImproperlyConfigured(f"{where}: the port must be 1-65535 or *")
    return HostRule(host, int(port))


def webhook_hosts_from_env(var: str) -> tuple[HostRule, ...]:
    raw = os.environ.get(var, "").strip()
    return parse_webhook_hosts(raw, var)


def parse_webhook_hosts(raw: str, var: str = "TRELLIS_WEBHOOK_HOSTS") -> tuple[HostRule, ...]:
    return tuple(dict.fromkeys(_rule(entry.strip(), var) for entry in raw.split(",") if entry.strip()))


def check_webhook_url(url, rules) -> WebhookTarget:
    """The URL split for a request, if a webhook may call it; else ``WebhookUrlError``.

    http or https only; no credentials, no fragment, no whitespace or control characters; the
    host (and port) must match one of ``rules`` exactly."""
    if not isinstance(url, str) or not url:
        raise WebhookUrlError("invalid_webhook_url", "url must be an http:// or https:// URL")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlError("invalid_webhook_url", f"url must be at most {MAX_URL_LENGTH} characters")
    if any(ord(c) <= 0x20 or 0x7F <= ord(c) <= 0x9F for c in url):
        raise WebhookUrlError("invalid_webhook_url", "url must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookUrlError("invalid_webhook_url", "url is not a valid URL (check the host and port)") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise WebhookUrlError("invalid_webhook_url", "url must start with http:// or https://")
    if "@" in parts.netloc:
        raise WebhookUrlError("invalid_webhook_url", "url must not carry credentials (user:password@): "
                                                     "verify requests with the signature instead")
    if parts.fragment or url.endswith("#"):
        raise WebhookUrlError("invalid_webhook_url", "url must not have a #fragment")
    if not parts.hostname:
        raise WebhookUrlError("invalid_webhook_url", "url must name a host")
    try:
        host, is_address = normalize_host(parts.hostname)
    except ValueError as exc:
        raise WebhookUrlError("invalid_webhook_url", f"url has an invalid host: {exc}") from None
    port = port if port is not None else DEFAULT_PORTS[scheme]
    if port == 0:
        raise WebhookUrlError("invalid_webhook_url", "url has an invalid port")
    if not any(rule.allows(host, port, scheme) for rule in rules):
        raise WebhookUrlError(
            "webhook_host_not_allowed",
            f"{host}:{port} is not an approved webhook host on this server; "
            "the operator lists the hosts webhooks may call (TRELLIS_WEBHOOK_HOSTS)"
            if rules else "this server approves no webhook hosts (the operator sets TRELLIS_WEBHOOK_HOSTS)",
        )
    # non-ASCII in the path or query is percent-encoded (a request line is ASCII)
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe="!$%&'()*+,/:;=?@~")
    return WebhookTarget(scheme=scheme, host=host, port=port, target=target, is_address=is_address)

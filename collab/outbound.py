"""The one way Trellis calls a URL a tenant chose: project webhooks.

Project owners are untrusted tenants (docs/security.md#who-is-trusted), so a request leaves only under
these rules, all here:

- the URL passes ``collab.conf.webhook_hosts.check_webhook_url`` against the operator's list
  *now* (a host the operator removed is no longer called);
- the host is resolved once and the connection goes to that address (*pinned*): a name
  whose answer changes between the check and the connect (DNS rebinding) cannot steer it
  elsewhere. A name resolving to an address that is not globally routable (loopback,
  private, shared, link-local, unique-local, multicast, reserved …) or to a cloud metadata
  address is refused; an address the operator listed literally is used as listed. ``Host`` and the TLS name (SNI and certificate check) stay
  the URL's host;
- no proxy from the environment, no redirect ever followed (``http.client`` follows none:
  a 3xx is an answer like any other), no cookies;
- a timeout per socket operation and one deadline for the whole attempt; only the status
  line and headers are read, never the body, so nothing the remote host says is kept.
"""

import http.client
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass

from collab.conf.webhook_hosts import WebhookTarget, WebhookUrlError, check_webhook_url


@dataclass(frozen=True)
class Answer:
    """How one attempt went: the HTTP status (None if there was none), and for a failure a code,
    a reason written by Trellis (never the remote host's text) and whether to try again."""

    status: int | None
    ok: bool
    code: str = ""
    reason: str = ""
    retryable: bool = False


class Refused(Exception):
    def __init__(self, code: str, reason: str, retryable: bool = False):
        super().__init__(reason)
        self.code, self.reason, self.retryable = code, reason, retryable


# Cloud metadata and platform endpoints that sit on globally routable addresses (the others —
# 169.254.169.254, fd00:ec2::254, 100.100.100.200 — are not global and refused as such)
METADATA_ADDRESSES = frozenset(map(ipaddress.ip_address, ("168.63.129.16",)))


def refused_address(address: str) -> bool:
    """Whether a looked-up address is one a name may not lead to: anything not globally
    routable (``ipaddress``'s ``is_global``: loopback, private 10/8, 172.16/12, 192.168/16,
    shared 100.64/10, link-local, unique-local fc00::/7, multicast, reserved, documentation …)
    and the cloud platforms' metadata addresses."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast or ip in METADATA_ADDRESSES


def pin(target: WebhookTarget) -> str:
    """The address to connect to: the listed address itself, or the first acceptable one the
    host name resolves to now."""
    if target.is_address:
        return target.host
    try:
        found = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise Refused("webhook_dns", f"could not resolve {target.host}", retryable=True) from None
    addresses = [info[4][0] for info in found]
    for address in addresses:
        if not refused_address(address):
            return address
    raise Refused("webhook_address_refused",
                  f"{target.host} resolves to an address that is not globally routable (or a cloud metadata "
                  "address), which webhooks may not call; the operator may list an address itself")


class _PinnedHTTPS(http.client.HTTPSConnection):
    """HTTPS to a pinned address, with SNI and the certificate check done for the URL's host."""

    def __init__(self, address: str, port: int, *, server_hostname: str, timeout: float):
        super().__init__(address, port, timeout=timeout, context=ssl.create_default_context())
        self._server_hostname = server_hostname

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._server_hostname)


def status_answer(status: int) -> Answer:
    """A received status: 2xx delivered; a redirect is not followed and not retried (register the
    final URL); 408, 425, 429 and 5xx are retried; any other 4xx is the receiver's refusal."""
    if 200 <= status < 300:
        return Answer(status, True)
    if 300 <= status < 400:
        return Answer(status, False, "webhook_redirect",
                      f"the receiver answered with a redirect (HTTP {status}), which is not followed: "
                      "register the final URL")
    if status in (408, 425, 429) or status >= 500:
        return Answer(status, False, "webhook_http_error", f"the receiver failed (HTTP {status})", True)
    return Answer(status, False, "webhook_rejected", f"the receiver refused the delivery (HTTP {status})")


def post(url: str, body: bytes, headers: dict, *, rules, timeout: float) -> Answer:
    """POST ``body`` to ``url`` once under the rules above; never raises for a network failure."""
    try:
        target = check_webhook_url(url, rules)
        address = pin(target)
    except WebhookUrlError as exc:
        return Answer(None, False, exc.code, exc.detail)
    except Refused as exc:
        return Answer(None, False, exc.code, exc.reason, exc.retryable)
    if target.scheme == "https":
        conn = _PinnedHTTPS(address, target.port, server_hostname=target.host, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(address, target.port, timeout=timeout)
    # one deadline for the whole attempt: a receiver that trickles its answer byte by byte
    # is cut off, not waited for a timeout per byte
    expired = threading.Event()
    deadline = threading.Timer(timeout * 2, _abort, args=(conn, expired))
    deadline.daemon = True
    deadline.start()
    try:
        conn.request("POST", target.target, body=body,
                     headers={**headers, "Host": target.host_header, "Content-Length": str(len(body))})
        response = conn.getresponse()
        return status_answer(response.status)
    except (TimeoutError, http.client.HTTPException, OSError) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            return Answer(None, False, "webhook_timeout", f"the receiver did not answer within {timeout:g} s", True)
        if isinstance(exc, ssl.SSLError):
            return Answer(None, False, "webhook_tls", f"TLS with {target.host} failed ({type(exc).__name__})", True)
        return Answer(None, False, "webhook_unreachable",
                      f"could not reach {target.host}:{target.port} ({type(exc).__name__})", True)
    finally:
        deadline.cancel()
        conn.close()


def _abort(conn, expired: threading.Event) -> None:
    expired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

"""Project webhooks, through the API, a real worker and a real receiver.
Tenants are untrusted (docs/security.md#who-is-trusted): their URLs reach only the operator's hosts, never
another project's webhook, and no secret reaches the event log.

The receiver is a threaded ``http.server`` in this process; the worker posts to it on
127.0.0.1, which the test settings (and ``process_env``) approve on any port. Nothing is
mocked: the turn runs on the worker, the delivery row commits with the execution's end,
and the worker's attempt is what the receiver sees.
"""

import hashlib
import hmac
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from collab.conf.webhook_hosts import parse_webhook_hosts
from tests.conftest import WEBHOOK_TEST_HOSTS, poll

RECEIVER_TEXT = "receiver-private-text-7f3a"  # what the receiver writes in every answer body


@pytest.fixture(autouse=True)
def approved_hosts(settings):
    """This process approves what the worker processes approve (``process_env``)."""
    settings.TRELLIS_WEBHOOK_HOSTS = parse_webhook_hosts(WEBHOOK_TEST_HOSTS)


class Receiver:
    """A real HTTP server: records every request; answers from ``answers`` in order
    (``(status, headers)``), then 200."""

    def __init__(self):
        self.requests = []
        self.answers = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver.lock:
                    receiver.requests.append({"method": self.command, "path": self.path,
                                              "headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body})
                    status, headers = receiver.answers.pop(0) if receiver.answers else (200, {})
                text = RECEIVER_TEXT.encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            do_POST = do_GET = _record

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path="/hook", host="127.0.0.1"):
        return f"http://{host}:{self.port}{path}"

    def received(self):
        with self.lock:
            return list(self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def register(api, url, project="alpha"):
    r = api.post(f"/api/projects/{project}/webhooks", {"url": url, "description": "ci"})
    assert r.status_code == 201, r.content
    return r.json()


def settled_delivery(api, webhook_id, statuses=("delivered", "failed"), timeout=60.0):
    """The webhook's one delivery once it is delivered or given up (retries go out on the
    workers' reconcile timer, every few seconds)."""
    def done():
        rows = api.get(f"/api/webhooks/{webhook_id}/deliveries").json()
        return rows if rows and all(d["status"] in statuses for d in rows) else None

    rows = poll(done, timeout=timeout, interval=0.1, what="the webhook delivery to settle")
    assert len(rows) == 1, rows
    return rows[0]


def verifies(secret: str, request: dict) -> bool:
    """The README's recipe: HMAC-SHA256 over ``timestamp + "." + raw body`` with the secret."""
    timestamp = request["headers"]["x-trellis-timestamp"]
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + request["body"], hashlib.sha256).hexdigest()
    return hmac.compare_digest(request["headers"]["x-trellis-signature"], f"v1={expected}")


@pytest.mark.slow
def test_a_turn_that_ends_is_posted_once_signed_to_the_project_webhook(team, api_as, scripted_session, receiver, worker):
    hook = register(api_as(team.maintainer), receiver.url())
    assert hook["secret"].startswith("whsec_") and hook["url"] == receiver.url()
    api, sid = scripted_session(team.member, [{"text": "done: {{prompt}}"}])

    turn = api.post(f"/api/sessions/{sid}/turns", {"prompt": "build it"}).json()
    assert api.wait(turn["execution_id"])["status"] == "succeeded"
    delivery = settled_delivery(api_as(team.maintainer), hook["id"])

    assert delivery["status"] == "delivered" and delivery["attempts"] == 1
    assert delivery["last_status_code"] == 200 and delivery["execution"] == turn["execution_id"]
    [request] = receiver.received()
    assert request["method"] == "POST" and request["path"] == "/hook"
    headers = request["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["x-trellis-event"] == "execution.finished"
    assert headers["x-trellis-delivery"] == delivery["id"] and headers["x-trellis-attempt"] == "1"
    assert headers["x-trellis-timestamp"].isdigit()
    assert verifies(hook["secret"], request)
    assert not verifies("whsec_another", request)
    body = json.loads(request["body"])
    assert body["id"] == delivery["id"] and body["type"] == "execution.finished"
    assert body["project"]["slug"] == "alpha"
    assert body["session"]["id"] == sid
    execution = body["execution"]
    assert execution["id"] == turn["execution_id"] and execution["status"] == "succeeded"
    assert execution["session"] == sid and execution["result"] == "done: build it"
    assert delivery["payload"] == body  # the body as stored is the body as sent


@pytest.mark.slow
def test_a_receiver_failing_with_500_gets_the_delivery_again_until_it_answers_200(team, api_as, scripted_session,
                                                                                  receiver, worker):
    receiver.answers = [(500, {})]
    hook = register(api_as(team.owner), receiver.url())
    api, sid = scripted_session(team.member, [{"text": "ok"}])

    turn = api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()
    api.wait(turn["execution_id"])
    delivery = settled_delivery(api_as(team.owner), hook["id"])

    assert delivery["status"] == "delivered" and delivery["attempts"] == 2
    assert [(h["attempt"], h["status_code"], h["error_code"]) for h in delivery["history"]] == [
        (1, 500, "webhook_http_error"), (2, 200, "")]
    first, second = receiver.received()
    # one delivery, sent twice: the same id (the receiver's idempotency key) and the same body,
    # each attempt signed afresh
    assert first["headers"]["x-trellis-delivery"] == second["headers"]["x-trellis-delivery"] == delivery["id"]
    assert [first["headers"]["x-trellis-attempt"], second["headers"]["x-trellis-attempt"]] == ["1", "2"]
    assert first["body"] == second["body"]
    assert verifies(hook["secret"], first) and verifies(hook["secret"], second)
    assert RECEIVER_TEXT not in json.dumps(delivery)


@pytest.mark.slow
def test_a_redirect_answer_is_not_followed(team, api_as, scripted_session, receiver, worker):
    receiver.answers = [(302, {"Location": receiver.url("/elsewhere")})]
    hook = register(api_as(team.owner), receiver.url())
    api, sid = scripted_session(team.member, [{"text": "ok"}])

    api.wait(api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"])
    delivery = settled_delivery(api_as(team.owner), hook["id"])

    assert delivery["status"] == "failed" and delivery["attempts"] == 1
    assert delivery["last_status_code"] == 302 and delivery["last_error_code"] == "webhook_redirect"
    assert [r["path"] for r in receiver.received()] == ["/hook"]  # /elsewhere was never asked
    assert RECEIVER_TEXT not in json.dumps(delivery)  # the receiver's answer text is kept nowhere


@pytest.mark.slow
def test_a_cancelled_execution_notifies_the_webhook_too(team, api_as, scripted_session, receiver, worker):
    hook = register(api_as(team.owner), receiver.url())
    api, sid = scripted_session(team.member, [{"sleep_ms": 30000}, {"text": "never"}])
    turn = api.post(f"/api/sessions/{sid}/turns", {"prompt": "slow"}).json()
    running = api.wait(turn["execution_id"], statuses={"running"})

    r = api.post(f"/api/executions/{turn['execution_id']}/commands",
                 {"command_id": "stop-1", "action": "execution.cancel", "expected_version": running["version"],
                  "payload": {}})
    assert r.status_code == 202, r.content
    assert api.wait(turn["execution_id"])["status"] == "cancelled"
    delivery = settled_delivery(api_as(team.owner), hook["id"])

    assert delivery["status"] == "delivered"
    [request] = receiver.received()
    body = json.loads(request["body"])
    assert body["execution"]["id"] == turn["execution_id"] and body["execution"]["status"] == "cancelled"
    assert verifies(hook["secret"], request)


@pytest.mark.slow
def test_an_approved_name_that_resolves_to_loopback_is_not_called(team, api_as, scripted_session, receiver,
                                                                         worker):
    """``localhost:*`` is approved by name; it resolves to a loopback address, which a name may
    not lead to (only an address the operator lists literally may be loopback)."""
    hook = register(api_as(team.owner), receiver.url(host="localhost"))
    api, sid = scripted_session(team.member, [{"text": "ok"}])

    api.wait(api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).json()["execution_id"])
    delivery = settled_delivery(api_as(team.owner), hook["id"])

    assert delivery["status"] == "failed" and delivery["last_error_code"] == "webhook_address_refused"
    assert delivery["last_status_code"] is None
    assert receiver.received() == []


@pytest.mark.parametrize(("url", "code"), [
    ("http://evil.example.com/hook", "webhook_host_not_allowed"),
    ("http://169.254.169.254/latest/meta-data", "webhook_host_not_allowed"),
    ("http://127.0.0.2:8080/hook", "webhook_host_not_allowed"),
    ("ftp://127.0.0.1/hook", "invalid_webhook_url"),
    ("http://user:pw@127.0.0.1:8080/hook", "invalid_webhook_url"),
    ("http://127.0.0.1:8080/hook#frag", "invalid_webhook_url"),
    ("http://127.0.0.1:99999/hook", "invalid_webhook_url"),
    ("http://127.0.0.1:8080/a b", "invalid_webhook_url"),
    ("127.0.0.1:8080/hook", "invalid_webhook_url"),
])
def test_a_url_whose_host_is_not_approved_is_refused_with_a_code(team, api_as, url, code):
    api = api_as(team.owner)
    r = api.post("/api/projects/alpha/webhooks", {"url": url})
    assert r.status_code == 400, r.content
    assert r.json()["code"] == code
    assert api.get("/api/projects/alpha/webhooks").json() == []


def test_host_rules_match_host_and_port_exactly(team, api_as, settings):
    settings.TRELLIS_WEBHOOK_HOSTS = parse_webhook_hosts("ci.example.com,chat.example.com:8443")
    api = api_as(team.owner)

    def code(url):
        r = api.post("/api/projects/alpha/webhooks", {"url": url})
        return r.status_code if r.status_code == 201 else r.json()["code"]

    assert code("https://ci.example.com/hook") == 201  # the default port of its scheme
    assert code("http://CI.example.com./other") == 201  # case and a trailing dot do not matter
    assert code("https://ci.example.com:8443/hook") == "webhook_host_not_allowed"  # no port listed: default only
    assert code("https://chat.example.com:8443/hook") == 201
    assert code("https://chat.example.com/hook") == "webhook_host_not_allowed"
    assert code("https://sub.ci.example.com/hook") == "webhook_host_not_allowed"  # no wildcards
    assert code("https://ci.example.com.evil.net/hook") == "webhook_host_not_allowed"
    settings.TRELLIS_WEBHOOK_HOSTS = ()
    assert code("https://ci.example.com/again") == "webhook_host_not_allowed"


def test_a_webhook_is_managed_by_maintainers_only_and_hidden_from_other_projects(team, api_as):
    maintainer = api_as(team.maintainer)
    hook = register(maintainer, "http://127.0.0.1:9/hook")
    path = f"/api/webhooks/{hook['id']}"

    outsider = api_as(team.outsider)  # owns project beta
    assert outsider.get("/api/projects/alpha/webhooks").status_code == 404
    assert outsider.post("/api/projects/alpha/webhooks", {"url": "http://127.0.0.1:9/x"}).status_code == 404
    for response in (outsider.get(path), outsider.patch(path, {"active": False}), outsider.delete(path),
                     outsider.post(f"{path}/rotate-secret"), outsider.get(f"{path}/deliveries"),
                     outsider.get("/api/webhooks/000000000000")):
        assert response.status_code == 404, response.content
        assert response.json() == {"detail": "not found", "code": "not_found"}

    for who in (team.member, team.viewer):  # in the project, below maintainer: forbidden, even to read
        api = api_as(who)
        assert api.get("/api/projects/alpha/webhooks").status_code == 403
        assert api.get(path).status_code == 403
        assert api.patch(path, {"url": "http://127.0.0.1:9/mine"}).status_code == 403
        assert api.delete(path).status_code == 403

    listed = maintainer.get("/api/projects/alpha/webhooks").json()
    assert [w["id"] for w in listed] == [hook["id"]] and "secret" not in listed[0]
    assert "secret" not in maintainer.get(path).json()
    assert maintainer.patch(path, {"active": False}).json()["active"] is False
    assert api_as(team.owner).get(path).status_code == 200


def test_the_secret_is_shown_on_create_and_rotate_only_and_changes_are_audited(team, api_as):
    from collab.models import Event, Webhook

    api = api_as(team.owner)
    hook = register(api, "http://127.0.0.1:9/hook?token=abc")
    r = api.post(f"/api/webhooks/{hook['id']}/rotate-secret")
    assert r.status_code == 200, r.content
    rotated = r.json()["secret"]
    assert rotated.startswith("whsec_") and rotated != hook["secret"]
    assert Webhook.objects.get(pk=hook["id"]).secret == rotated
    assert api.patch(f"/api/webhooks/{hook['id']}", {"url": "http://localhost:9/moved"}).status_code == 200
    assert api.delete(f"/api/webhooks/{hook['id']}").status_code == 204
    assert api.get(f"/api/webhooks/{hook['id']}").status_code == 404

    events = list(Event.objects.filter(project=team.alpha, type__startswith="webhook.").order_by("seq"))
    assert [e.type for e in events] == ["webhook.created", "webhook.secret_rotated", "webhook.updated",
                                        "webhook.deleted"]
    assert all(e.actor_id == team.owner.pk for e in events)
    assert events[0].payload["host"] == "127.0.0.1:9"
    assert events[2].payload["host"] == {"from": "127.0.0.1:9", "to": "localhost:9"}
    logged = json.dumps([e.payload for e in events])
    assert "whsec_" not in logged and "token=abc" not in logged and "/moved" not in logged


def test_a_project_has_one_webhook_per_url(team, api_as):
    api = api_as(team.owner)
    register(api, "http://127.0.0.1:9/hook")
    r = api.post("/api/projects/alpha/webhooks", {"url": "http://127.0.0.1:9/hook"})
    assert r.status_code == 409 and r.json()["code"] == "webhook_exists"


def test_the_project_page_offers_webhooks_to_maintainers_and_shows_a_new_secret_once(team, browser_of):
    from collab.models import Webhook

    owner = browser_of(team.owner)
    r = owner.post("/p/alpha/webhooks", {"action": "add", "url": "http://127.0.0.1:9/page-hook"})
    assert r.status_code == 200
    secret = Webhook.objects.get(project=team.alpha).secret
    assert secret in r.content.decode()
    page = owner.get("/p/alpha/").content.decode()
    assert "http://127.0.0.1:9/page-hook" in page and secret not in page

    refused = owner.post("/p/alpha/webhooks", {"action": "add", "url": "http://evil.example.com/"})
    assert refused.status_code == 400 and "not an approved webhook host" in refused.content.decode()

    member_page = browser_of(team.member).get("/p/alpha/").content.decode()
    assert 'id="webhooks"' not in member_page and "page-hook" not in member_page
    assert browser_of(team.member).post("/p/alpha/webhooks", {"action": "add", "url": "http://127.0.0.1:9/m"}
                                        ).status_code == 403


def test_a_change_to_an_unapproved_url_is_refused_and_changes_nothing(team, api_as):
    api = api_as(team.maintainer)
    hook = register(api, "http://127.0.0.1:9/hook")
    r = api.patch(f"/api/webhooks/{hook['id']}", {"url": "https://evil.example.com/hook", "active": False})
    assert r.status_code == 400 and r.json()["code"] == "webhook_host_not_allowed"
    after = api.get(f"/api/webhooks/{hook['id']}").json()
    assert after["url"] == "http://127.0.0.1:9/hook" and after["active"] is True
    r = api.patch(f"/api/webhooks/{hook['id']}", {"url": "http://127.0.0.1:9/hook\tx"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_webhook_url"


def test_the_page_form_acts_only_on_a_webhook_of_the_project_it_names(team, api_as, browser_of):
    """Someone who maintains two projects cannot reach one project's webhook through the other's
    page (``access_webhook(…, project_id=…)``): 404, and the webhook is untouched."""
    from accounts.models import Membership
    from collab.models import Webhook

    Membership.objects.create(user=team.outsider, project=team.alpha, role="maintainer")  # owner of beta too
    beta_hook = register(api_as(team.outsider), "http://127.0.0.1:9/beta-hook", project="beta")
    page = browser_of(team.outsider)
    for action in ("delete", "rotate", "toggle"):
        r = page.post("/p/alpha/webhooks", {"action": action, "webhook": beta_hook["id"], "active": "0"})
        assert r.status_code == 404, (action, r.status_code)
    hook = Webhook.objects.get(pk=beta_hook["id"])
    assert hook.active and hook.secret_rotated_at is None
    assert page.post("/p/beta/webhooks", {"action": "delete", "webhook": beta_hook["id"]}).status_code == 302
    assert not Webhook.objects.filter(pk=beta_hook["id"]).exists()


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "100.100.100.200", "169.254.169.254",
    "168.63.129.16", "0.0.0.0", "224.0.0.1", "192.0.2.10", "::1", "fd00:ec2::254", "fe80::1", "::ffff:10.0.0.1",
])
def test_an_approved_name_that_resolves_to_an_address_not_globally_routable_is_not_called(monkeypatch, address):
    """Private, shared (100.64/10), link-local, unique-local, reserved and documentation ranges,
    and the cloud metadata addresses, whatever range they sit in: a name leading to one is refused
    before any connection is made."""
    from collab import outbound
    from collab.conf.webhook_hosts import WebhookTarget

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    monkeypatch.setattr(outbound.socket, "getaddrinfo", lambda *a, **kw: [(family, socket.SOCK_STREAM, 6, "", (address, 443))])
    with pytest.raises(outbound.Refused) as refused:
        outbound.pin(WebhookTarget("https", "hooks.example.com", 443, "/hook", False))
    assert refused.value.code == "webhook_address_refused"


def test_an_approved_name_that_resolves_to_a_public_address_is_pinned_to_it(monkeypatch):
    from collab import outbound
    from collab.conf.webhook_hosts import WebhookTarget

    found = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 443)),
             (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 443))]
    monkeypatch.setattr(outbound.socket, "getaddrinfo", lambda *a, **kw: found)
    assert outbound.pin(WebhookTarget("https", "hooks.example.com", 443, "/hook", False)) == "93.184.216.34"

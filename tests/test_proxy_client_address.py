"""Behind the shipped proxy, the web processes know each client's address: ``deploy/nginx.conf``
sets ``X-Forwarded-For`` to the address it was connected from (never appending a client's own),
and the Procfile's ``web`` line runs daphne with ``--proxy-headers``. Login throttling keys on
(username, address), so one client's wrong passwords lock out that client, not everyone who
comes through the proxy. Clients here connect from different loopback addresses (127.0.0.2,
127.0.0.3), as different machines would."""

import os
import sys
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.conftest import free_port, poll
from tests.test_scaled_deployment import _ready, kill, start, start_proxy

pytestmark = pytest.mark.slow

PASSWORD = "pw-secret-123"  # the team's users' (tests/conftest.py)


def login(client: httpx.Client, password: str, **headers) -> int:
    client.get("/accounts/login/")
    r = client.post("/accounts/login/", data={"username": "member", "password": password,
                                              "csrfmiddlewaretoken": client.cookies["csrftoken"]}, headers=headers)
    return r.status_code


def client_from(address: str, base_url: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, transport=httpx.HTTPTransport(local_address=address), timeout=30)


def test_one_clients_failed_logins_behind_the_proxy_do_not_lock_out_another(transactional_db, team, process_env,
                                                                            tmp_path):
    port = free_port()
    env = dict(process_env, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HOST="127.0.0.1",
               PORT=str(port))
    web = start("web", env, tmp_path / "web.log")  # the Procfile's line, as a process manager runs it
    web.url = f"http://127.0.0.1:{port}"
    proxy = None
    try:
        poll(lambda: _ready(web), timeout=60, what="the web process")
        proxy = start_proxy([web], tmp_path)
        poll(lambda: _ready(proxy), timeout=30, what="the proxy")
        limit = settings.AXES_FAILURE_LIMIT
        with client_from("127.0.0.2", proxy.url) as attacker, client_from("127.0.0.3", proxy.url) as member:
            failures = [login(attacker, "wrong password") for _ in range(limit)]
            assert failures == [200] * (limit - 1) + [429], failures  # the form again, then locked
            assert login(attacker, PASSWORD) == 429  # that address is locked out of the account …
            # … and naming another address does not get it out: the proxy sets the header itself
            assert login(attacker, PASSWORD, **{"X-Forwarded-For": "127.0.0.9"}) == 429
            assert login(member, PASSWORD) == 302  # the account's owner, from elsewhere, logs in
    finally:
        if proxy is not None:
            kill(proxy)
        kill(web)

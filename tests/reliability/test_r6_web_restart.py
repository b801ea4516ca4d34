"""R6 (live events, docs/contract.md#events, on the scaled deployment): a web process restarted under many
WebSocket clients → after resync every client's last ``seq`` equals the server's, none received
twice, none skipped.

``CLIENTS`` sockets follow one session on a real daphne process. Events are committed while they
listen; then the web process is SIGKILLed, more events are committed while it is down, and it is
started again on the same port. Every client reconnects as the page's script does — with
``?after=`` the last ``seq`` it applied — while still more events are committed, racing the
resync. Each client stops when it holds the log's last ``seq``. On PostgreSQL + Redis the live
path is channels-redis; on the embedded default (SQLite) the web process's database relay.
"""

import asyncio
import os
import signal
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from tests.collab.test_live_events import Refused, WsClient, auth_header, write_events
from tests.conftest import free_port, start_daphne
from tests.reliability.conftest import size

pytestmark = pytest.mark.slow

CLIENTS = size(30, 200)
EVENTS = size(10, 50)  # per phase: before the kill, while down, during the resync
WAIT = 120.0




def kill(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


def last_seq(sid) -> int:
    from collab.models import Event

    return Event.objects.filter(session_id=sid).order_by("-seq").values_list("seq", flat=True).first() or 0


@pytest.mark.timeout(300)
def test_a_restarted_web_process_leaves_every_client_resynced_without_gaps_or_duplicates(
    team, scripted_session, process_env, tmp_path, transactional_db, figure
):
    _, sid = scripted_session(team.member, [{"text": "unused"}])
    headers = auth_header(team.member)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "daphne.log"
    # the clients are one member standing in for as many people: more sockets than one person's
    # bound on long-lived connections (TRELLIS_MAX_OPEN_STREAMS_PER_USER) allows
    process_env = {**process_env, "TRELLIS_MAX_OPEN_STREAMS_PER_USER": str(CLIENTS + 8)}
    web = start_daphne(process_env, port, log)
    received: list[list[int]] = [[] for _ in range(CLIENTS)]
    reconnects = [0] * CLIENTS

    async def follow(i: int, ready: asyncio.Event, done: asyncio.Event, goal: list[int]):
        seqs = received[i]
        deadline = time.monotonic() + WAIT
        client = None
        while time.monotonic() < deadline:
            if client is None:
                after = seqs[-1] if seqs else 0
                try:
                    client = await WsClient.connect(f"ws://127.0.0.1:{port}/ws/sessions/{sid}/?after={after}", headers, url)
                except (OSError, asyncio.IncompleteReadError, TimeoutError, Refused):
                    await asyncio.sleep(0.1)  # the web process is down or busy: try again, as app.js does
                    continue
                if seqs:
                    reconnects[i] += 1
                ready.set()
            if done.is_set() and seqs and seqs[-1] >= goal[0]:
                await client.close()
                return
            try:
                frame = await asyncio.wait_for(client._message(), 0.5)
            except TimeoutError:
                continue
            except (OSError, asyncio.IncompleteReadError, AssertionError):
                client.writer.close()
                client = None  # the web process died under it
                continue
            seqs.append(frame["seq"])
        raise AssertionError(f"client {i} stopped at {seqs[-1:]} of {goal[0]}")

    async def body():
        nonlocal web
        goal = [0]
        done = asyncio.Event()
        readies = [asyncio.Event() for _ in range(CLIENTS)]
        tasks = [asyncio.create_task(follow(i, readies[i], done, goal)) for i in range(CLIENTS)]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), WAIT)
        await sync_to_async(write_events)(sid, EVENTS)
        before = await sync_to_async(last_seq)(sid)
        deadline = time.monotonic() + WAIT
        while min((s[-1] if s else 0) for s in received) < before:  # everyone has the first phase live
            assert time.monotonic() < deadline, "the first events did not reach every client"
            await asyncio.sleep(0.05)
        await sync_to_async(kill)(web)  # the web process dies under every client
        await sync_to_async(write_events)(sid, EVENTS)  # committed while it is down
        web = await sync_to_async(start_daphne)(process_env, port, log)
        await sync_to_async(write_events)(sid, EVENTS)  # racing the clients' resync
        goal[0] = await sync_to_async(last_seq)(sid)
        done.set()
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        return goal[0]

    try:
        server_seq = async_to_sync(body)()
    finally:
        kill(web)
    short = [i for i, s in enumerate(received) if not s or s[-1] != server_seq]
    duplicated = [i for i, s in enumerate(received) if len(s) != len(set(s))]
    gaps = [i for i, s in enumerate(received) if s != list(range(1, len(s) + 1))]
    figure(f"R6: {CLIENTS} WebSocket clients, web process SIGKILLed and restarted, {sum(reconnects)} reconnects, "
           f"{3 * EVENTS} events, server seq {server_seq}: {CLIENTS - len(short)} clients at it, "
           f"{len(duplicated)} with duplicates, {len(gaps)} with gaps")
    assert short == [] and duplicated == [] and gaps == [], (short, duplicated, gaps)
    assert sum(reconnects) >= CLIENTS  # every client really lost its socket and resynced

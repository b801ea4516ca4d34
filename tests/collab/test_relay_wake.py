"""The embedded relay is woken by another process's commit (the "Live" target of
docs/performance.md#targets): it does not wait out a poll interval per event.

The relay (``collab/realtime/relay.py``) of this process watches a session with both its poll intervals
set to an hour; another process — the way a worker does on the embedded default, with its own
in-memory layer and no Redis — commits events on that session. Each one reaches this process's
channel group as a ``collab.poke`` well within the wait: only the wake-up after commit
(``collab.realtime.push.wake_relays``) can carry it there.
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30.0  # seconds for one poke; the relay's own poll would come after an hour

COMMIT = """
import django, sys
django.setup()
from django.db import transaction
from collab.events import send_event_on_commit
with transaction.atomic():
    print(send_event_on_commit(sys.argv[1], "test.note", {"from": "another process"}).seq)
"""


def commit_elsewhere(env: dict, sid: str) -> int:
    """One event committed by a separate process without a shared layer; returns its seq."""
    out = subprocess.run([sys.executable, "-c", COMMIT, sid], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


@pytest.mark.slow
@override_settings(TRELLIS_EVENT_POLL=True, TRELLIS_EVENT_NOTIFY=True, TRELLIS_EVENT_POLL_INTERVAL=3600,
                   TRELLIS_EVENT_NOTIFY_POLL_INTERVAL=3600)
def test_the_embedded_relay_is_woken_by_another_process_commit(transactional_db, team, process_env):
    from channels.layers import get_channel_layer

    from collab.realtime.push import relay_dir, session_group
    from collab.realtime.relay import relay
    from collab.models import Session
    from collab.services.sessions import do_create_session

    session = do_create_session(team.member, team.alpha, title="relay")
    start = Session.objects.get(pk=session.pk).last_event_seq
    env = {k: v for k, v in process_env.items() if k != "REDIS_URL"}  # the embedded layout: no shared layer
    env.update(TRELLIS_EVENT_POLL="1", TRELLIS_EVENT_NOTIFY="1", DJANGO_SETTINGS_MODULE="config.settings")

    async def body():
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(session_group(session.pk), channel)
        watcher = relay()
        watcher.watch(session.pk, start)
        try:
            for _ in range(200):  # the relay's socket is bound once its task has started
                if os.path.isdir(relay_dir()) and any(n.startswith(f"{os.getpid()}-") for n in os.listdir(relay_dir())):
                    break
                await asyncio.sleep(0.05)
            pokes = []
            for _ in range(2):  # the second can only come from a wake-up: the first read is long done
                seq = await asyncio.to_thread(commit_elsewhere, env, session.pk)
                while True:
                    message = await asyncio.wait_for(layer.receive(channel), WAIT)
                    if message.get("type") == "collab.poke" and message["seq"] >= seq:
                        pokes.append(message["seq"])
                        break
            return pokes
        finally:
            watcher.unwatch(session.pk)
            await layer.group_discard(session_group(session.pk), channel)

    assert async_to_sync(body)() == [start + 1, start + 2]

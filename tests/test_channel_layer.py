"""The Redis channel layer's blocking ``group_send`` (collab/infra/channel_layer.py, part of reaching ≥ 100
turns/s): what it writes is received through channels-redis exactly as what the layer's own
``group_send`` writes — by a process-local channel and a plain one, with the group's and the
channels' expiry and each channel's capacity — and a thread pushing events uses it, not a loop."""

import asyncio
import threading
import time
import uuid

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from collab.infra.channel_layer import RedisChannelLayer

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="the Redis channel layer is used with REDIS_URL only")


def _layer(**config) -> RedisChannelLayer:
    """A layer of its own (a fresh prefix): nothing another test left in Redis is seen."""
    return RedisChannelLayer(hosts=[settings.REDIS_URL], prefix=f"test-layer-{uuid.uuid4().hex[:8]}", **config)


def _in_a_thread(fn, *args):
    """Run ``fn`` on a plain thread (as a worker's task or a sync view): the sender's own."""
    out = {}

    def run():
        out["value"] = fn(*args)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(20)
    return out.get("value")


def _receive(layer, channel, timeout=5):
    async def get():
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout)
        finally:
            await layer.close_pools()

    return async_to_sync(get)()


def _members(layer, *channels, group="g"):
    async def add():
        for channel in channels:
            await layer.group_add(group, channel)
        await layer.close_pools()

    async_to_sync(add)()


def test_a_group_send_from_a_thread_reaches_local_and_plain_channels_as_the_layers_own():
    layer = _layer()
    local = async_to_sync(layer.new_channel)()  # "prefix.specific.<client>!<id>": one key per process
    plain = "plain-channel"
    _members(layer, local, plain)
    message = {"type": "collab.event", "event": {"seq": 3, "payload": {"text": "héllo"}}, "events": [1, 2]}
    full = _in_a_thread(layer.blocking_sender.group_send, "g", message)
    assert full == 0
    assert _receive(layer, local) == message
    assert _receive(layer, plain) == message
    # and the layer's own group_send, received the same way
    async_to_sync(layer.group_send)("g", {**message, "events": [4]})
    assert _receive(layer, plain) == {**message, "events": [4]}


def test_an_empty_group_sends_nothing_and_stale_members_are_dropped():
    layer = _layer(group_expiry=1)
    assert _in_a_thread(layer.blocking_sender.group_send, "nobody", {"type": "x"}) == 0
    _members(layer, "late-channel")
    time.sleep(2.1)  # the member was added more than group_expiry seconds ago
    _in_a_thread(layer.blocking_sender.group_send, "g", {"type": "x"})
    client = layer.blocking_sender.client(0)
    assert client.zcard(layer._group_key("g")) == 0
    assert client.exists(layer.prefix + "late-channel") == 0


def test_a_channel_at_capacity_gets_no_more_and_is_counted():
    layer = _layer(capacity=2)
    _members(layer, "busy")
    sent = [_in_a_thread(layer.blocking_sender.group_send, "g", {"type": "x", "n": n}) for n in range(3)]
    assert sent == [0, 0, 1]
    assert [_receive(layer, "busy")["n"] for _ in range(2)] == [0, 1]
    key = layer.prefix + "busy"
    assert layer.blocking_sender.client(0).ttl(key) in (-2, *range(1, layer.expiry + 1))


def test_messages_expire_as_the_layers_own(monkeypatch):
    """A message older than ``expiry`` is dropped by the next send to its channel, as channels-redis
    drops it (its receive would skip it anyway)."""
    layer = _layer(expiry=1)
    _members(layer, "slow")
    _in_a_thread(layer.blocking_sender.group_send, "g", {"type": "x", "n": 0})
    time.sleep(2.1)
    _in_a_thread(layer.blocking_sender.group_send, "g", {"type": "x", "n": 1})
    assert layer.blocking_sender.client(0).zcard(layer.prefix + "slow") == 1
    assert _receive(layer, "slow")["n"] == 1


def test_a_thread_pushing_events_sends_them_itself_and_an_event_loop_does_not_block(monkeypatch):
    """``push_events`` from a plain thread goes through the blocking sender (no push loop is
    started); on a running event loop it does not (that would stall the loop). A layer of the
    test's own, as ``get_channel_layer`` would give: nothing else in this process uses it."""
    from collab.realtime import push

    layer = _layer()
    monkeypatch.setattr(push, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(push, "_loop", None)
    channel = async_to_sync(layer.new_channel)()
    _members(layer, channel, group=push.session_group("abcdefabcdef"))
    wires = [{"seq": 1, "type": "test", "payload": {}}, {"seq": 2, "type": "test", "payload": {"a": 1}}]
    _in_a_thread(push.push_events, "abcdefabcdef", wires)
    assert push._loop is None
    received = _receive(layer, channel)
    assert received["events"] == wires and received["event"] == wires[-1]

    async def on_a_loop():
        return push._blocking_sender(layer)

    assert asyncio.run(on_a_loop()) is None
    assert _in_a_thread(push._blocking_sender, layer) is layer.blocking_sender


_layers_seen: list = []  # the layers themselves: an id could be reused once one is collected


def test_a_test_gets_the_process_channel_layer_of_its_own():
    """First of two: note the process's layer as this test sees it."""
    from channels.layers import get_channel_layer

    _layers_seen.append(get_channel_layer())


def test_the_next_test_starts_with_another_channel_layer():
    """A layer read on an earlier test's loop is never read on this one's (tests/conftest.py:
    channels-redis keeps per-channel locks across loops, and one left behind by a loop that ended
    mid-read fails the next loop that contends for it)."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    assert _layers_seen and all(layer is not seen for seen in _layers_seen)

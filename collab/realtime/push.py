"""Pushing committed events to live listeners: the channel layer, and waking the embedded relays.

After a transaction that wrote events commits (``collab.events.send_events_on_commit`` registers
the hand-off), ``push_events`` sends its events of one session to the session's group
(``session_group``) as one message; every listener (a socket's feed, a ``?wait=``, an SSE
stream: ``collab.realtime.subscription``) reads them with ``pushed_wires``. Best effort: the log
holds every event, and a listener that misses a push catches up from it by ``seq``.

On the embedded default each process has its own in-memory layer, so a worker's push reaches
only its own process: ``wake_relays`` then pokes every other process's relay
(``collab.realtime.relay``) through a datagram socket, and the relay reads the log.
"""

import asyncio
import itertools
import logging
import os
import socket
import threading

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)


def session_group(session_id: str) -> str:
    return f"session.{session_id}"

def pushed_wires(message: dict) -> list[dict]:
    """The events a ``collab.event`` message of the channel layer carries, in order (``push_events``
    sends a commit's events of a session as one message); [] for any other message."""
    if message.get("type") != "collab.event":
        return []
    wires = message.get("events")
    if isinstance(wires, list):
        return [w for w in wires if isinstance(w, dict)]
    wire = message.get("event")
    return [wire] if isinstance(wire, dict) else []


def push_events(session_id: str, wires: list[dict]) -> None:
    """Best effort, after a commit: the commit's events of one session to its live listeners, in
    order, as one message of the channel layer (one ``group_send`` per commit, however many events;
    a listener that misses a push catches up from the log by ``seq``). With Redis, a thread without
    an event loop sends it itself (``collab.infra.channel_layer``: one round trip when nobody listens,
    two when someone does); elsewhere it goes through the layer's ``group_send`` on a loop."""
    layer = get_channel_layer()
    if layer is None or not wires:
        return
    group = session_group(session_id)

    # one message for the lot: ``events`` in order; ``event`` (the last of them) is what a reader
    # of single events takes, and it reads the log for the ones before (a gap in ``seq``)
    message = {"type": "collab.event", "event": wires[-1], "events": wires}

    async def send_all():
        await layer.group_send(group, message)

    try:
        sender = _blocking_sender(layer)
        if sender is not None:
            sender.group_send(group, message)
        elif (loop := _push_loop(layer)) is None:
            async_to_sync(send_all)()
        else:
            sent = asyncio.run_coroutine_threadsafe(send_all(), loop)
            try:
                sent.result(PUSH_TIMEOUT_SECONDS)
            except BaseException:
                sent.cancel()  # never left running to land after this thread's next push
                raise
    except Exception:  # the log has them; listeners recover on the next event or reconnect
        log.warning("could not push events %s/%s-%s", session_id, wires[0].get("seq"), wires[-1].get("seq"),
                    exc_info=True)
    wake_relays()


def _blocking_sender(layer):
    """The layer's ``group_send`` for this thread (``collab.infra.channel_layer``), or None: where the
    layer has none, and on a running event loop, which a blocking send would stall."""
    sender = getattr(layer, "blocking_sender", None)
    if sender is None:
        return None
    try:
        asyncio.get_running_loop()
        return None
    except RuntimeError:
        return sender


# --- one push loop per process --------------------------------------------------------------------
#
# ``async_to_sync`` called from a plain thread (a worker process, a management command) runs the
# coroutine on a brand-new event loop in a new thread, and channels-redis keeps its connections per
# loop: every push paid for a thread, a loop and a fresh Redis connection (4–14 ms here, three times
# per turn in the worker, on the ``?wait=`` answer's critical path). Such threads push on one loop
# of their process instead, kept in a daemon thread, whose connections are reused. A thread that
# came from ``sync_to_async`` (a web request, a consumer) keeps ``async_to_sync``: it goes back to
# its server's own loop, which the in-memory layer needs. Pushes from one thread stay in order: each
# waits for its ``group_send``s to finish, as before (a commit's events of one session go in one hand-off).

PUSH_TIMEOUT_SECONDS = 10
_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


def _push_loop(layer) -> asyncio.AbstractEventLoop | None:
    """The process's push loop, or None where ``async_to_sync`` is right (see above)."""
    global _loop
    if isinstance(layer, InMemoryChannelLayer):  # its queues belong to the consumers' loop
        return None
    if "push_loop" in settings.TRELLIS_STOCK:
        return None  # asgiref's async_to_sync each time (docs/infrastructure.md)
    if getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None:
        return None  # a thread of an async server: async_to_sync hands the push back to its loop
    try:
        asyncio.get_running_loop()
        return None  # called on a loop (async_to_sync refuses it, and says so)
    except RuntimeError:
        pass
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid() or _loop[1].is_closed():  # made again after a fork
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="trellis-event-push", daemon=True).start()
            _loop = (os.getpid(), loop)
        return _loop[1]


WARM_GROUP = "trellis-push-warm-up"


def warm_push(wait: float = 0) -> None:
    """Open this process's channel-layer connection (and, where pushes go through one, its push
    loop) now, not at its first event: the first push of a fresh process set them up (~57 ms here,
    ``bench/live.py``), on that event's way to every listener. A worker process does it as
    it starts (``collab.apps``), in the background; ``wait`` > 0 waits that long for it. A no-op
    where pushes open nothing (the in-memory layer, a thread of a server without a blocking sender)."""
    layer = get_channel_layer()
    if layer is None:
        return
    sender = _blocking_sender(layer)
    if sender is not None:  # one round trip to each server, in the background
        warming = threading.Thread(target=_ping, args=(sender,), name="trellis-push-warm-up", daemon=True)
        warming.start()
        if wait:
            warming.join(wait)
        return
    loop = _push_loop(layer)
    if loop is None:
        return
    # one round trip: removing a member nobody added from a group nobody uses
    warmed = asyncio.run_coroutine_threadsafe(layer.group_discard(WARM_GROUP, "trellis.warm-up"), loop)
    if wait:
        try:
            warmed.result(wait)
        except Exception:  # best effort, like the pushes themselves
            log.warning("could not reach the channel layer to warm up the event push", exc_info=True)


def _ping(sender) -> None:
    try:
        sender.ping()
    except Exception:  # best effort, like the pushes themselves
        log.warning("could not reach the channel layer to warm up the event push", exc_info=True)


# --- waking the embedded relays (collab.realtime.relay) across processes -------------------------
#
# Without a shared channel layer a worker's push reaches only its own process. Every web
# process's relay (one per event loop) binds a Unix datagram socket in ``VAR_DIR/relay/``;
# a process that committed events sends each of the others' sockets one byte after commit, and
# the relay, woken, reads the watched sessions' ``last_event_seq`` at once instead of at its next
# poll. Best effort: a full queue or a stale socket drops the byte — a dropped byte is harmless
# while the relay has any other byte queued (it reads the database after draining them all), and
# the relay's slower poll covers processes that cannot reach these sockets (another machine,
# another VAR_DIR).

_relay_seq = itertools.count()
_own_relay_paths: set[str] = set()
_sender: tuple[int, socket.socket] | None = None


def relay_dir() -> str:
    return str(settings.VAR_DIR / "relay")


def wake_relays() -> None:
    """After a commit (the push): wake every other process's relay. A no-op with a shared layer."""
    global _sender
    if not (settings.TRELLIS_EVENT_POLL and settings.TRELLIS_EVENT_NOTIFY):
        return
    directory = relay_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    if _sender is None or _sender[0] != os.getpid():  # one per process, made again after a fork
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        _sender = (os.getpid(), sock)
    sock = _sender[1]
    for name in names:
        path = os.path.join(directory, name)
        if not name.endswith(".sock") or path in _own_relay_paths:
            continue  # this process's relays: its own in-memory layer had the push
        try:
            sock.sendto(b"1", path)
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)  # nobody is bound to it: a process that died without cleaning up
            except OSError:
                pass
        except OSError:  # a full queue (the relay is about to wake anyway), a path too long …
            pass


def open_relay_socket() -> socket.socket | None:
    """A relay's wake-up socket (non-blocking, bound in ``relay_dir()``), or None when waking is
    off or the socket cannot be made here (then the relay polls at the short interval)."""
    if not settings.TRELLIS_EVENT_NOTIFY:
        return None
    path = os.path.join(relay_dir(), f"{os.getpid()}-{next(_relay_seq)}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        os.makedirs(relay_dir(), exist_ok=True)
        if os.path.exists(path):
            os.unlink(path)
        sock.bind(path)
    except OSError:
        log.warning("the event relay cannot bind %s: it polls instead", path, exc_info=True)
        sock.close()
        return None
    sock.setblocking(False)
    _own_relay_paths.add(path)
    return sock


def close_relay_socket(sock: socket.socket) -> None:
    path = sock.getsockname()
    _own_relay_paths.discard(path)
    sock.close()
    try:
        os.unlink(path)
    except OSError:
        pass

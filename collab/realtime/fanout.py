"""The fan-out: one reader per session per process, however many sockets follow it.

A process's sockets on one session share a ``Feed``: the feed's own channel is the one member
of the session's group in this process, so a pushed event (or a relay poke) arrives here once,
not once per socket. The feed takes the events from the push — or, after a gap, from the log in
one query — redacts them once per viewer (``redact_wires_for``: no query at all when an event
names no session but this one, which is nearly every event), encodes each distinct frame once
and hands the same text to every socket, from the event loop: no trip to the sync thread per
socket. The cost of an event is one read at most, one redaction per distinct viewer and one
``send`` per socket.

Guarantees, per socket: frames in ``seq`` order, no gap, no repeat. Each subscriber records
the last seq it was sent; a frame goes to it only when it is the next one. A subscriber that
joins (or falls behind) reads the log itself, redacted for its viewer — exactly what the
consumer did before — and joins the live frames once it has read through what the feed has
started to deliver (``Feed.through``, set before any delivery yields). A push that is lost or
arrives out of order is read from the log at the next push or poke; the feed also looks at the
sessions' event counters every ``SAFETY_SECONDS`` (one query per process) and after the
layer failed, so a lost last push is not waited out until the next event.

Membership changes reach the sockets through the fan-out too (the consumers hold no channel of
their own): ``collab.access_changed`` (to the user's group, or the session's) makes each
affected viewer's access be checked once, and the sockets of a viewer who lost it closed;
``collab.token_revoked`` closes the sockets opened with that token.
"""

import asyncio
import json
import logging
import time
import weakref

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from collab.realtime.push import pushed_wires, session_group
from collab.realtime.relay import current_seqs, relay
from collab.selectors.events import PAGE, events_after, events_after_raw
from collab.selectors.redact import Memo, names_no_other_session, redact_wires_for
from collab.services.members import user_group

log = logging.getLogger(__name__)

UNKNOWN = object()  # an access check that could not be made
SAFETY_SECONDS = 10.0  # a lost push waits at most this long (the relay polls faster on its own)
REJOIN_SECONDS = 3600.0  # channels-redis forgets group members after a day: join again hourly


class Subscriber:
    """One socket following one session (``consumer``: a ``collab.consumers.SessionConsumer``)."""

    def __init__(self, feed: "Feed", consumer, viewer, last_seq: int):
        self.feed = feed
        self.consumer = consumer
        self.viewer = viewer
        self.key = getattr(viewer, "pk", None)  # what redaction depends on: the person
        self.last_seq = last_seq
        self.live = False  # True once it has read the log through what the feed delivers
        self.reading: asyncio.Task | None = None  # its own catch-up from the log
        self.again = False
        self.held = 0  # > 0 while its viewer's access is being checked again: nothing is sent

    def hold(self) -> None:
        """Send nothing more until ``release`` (its access is being checked again, or it closes)."""
        self.held += 1
        self.live = False

    def release(self) -> None:
        """Its access was confirmed: what was held back comes from the log (``catch_up``)."""
        self.held -= 1
        if not self.held and self in self.feed.subs:
            self.catch_up()

    async def send(self, text: str) -> None:
        try:
            await self.consumer.send(text_data=text)
        except Exception:  # the socket went away under us: it is unsubscribed by its disconnect
            log.debug("send to a closing socket failed", exc_info=True)

    def catch_up(self) -> None:
        """Read the log from ``last_seq`` for this viewer (in a task of its own), then go live."""
        self.live = False
        if self.held:
            return  # ``release`` catches it up
        if self.reading is not None and not self.reading.done():
            self.again = True
            return
        self.reading = asyncio.get_running_loop().create_task(self.feed.read_for(self))

    async def cancel(self) -> None:
        """Stop following (the socket closed or lost its access): nothing more is sent to it."""
        await self.feed.fanout.unsubscribe(self)


@database_sync_to_async
def _log_after(session_id: str, after: int) -> list[dict]:
    return events_after_raw(session_id, after, PAGE)


_redact_for = database_sync_to_async(redact_wires_for)
_events_after = database_sync_to_async(events_after)


class Feed:
    """A session's events for this process's sockets on it."""

    def __init__(self, fanout: "Fanout", session_id: str):
        self.fanout = fanout
        self.session_id = session_id
        self.subs: dict[Subscriber, None] = {}  # ordered set
        self.memo = Memo()  # which session each branch / job named is in: the same for everyone
        self.pushed: dict[int, dict] = {}  # wires pushed and not yet delivered, by seq
        self.target = 0  # the highest seq known to exist
        self.through = 0  # the highest seq whose delivery to live subscribers has begun
        self.wake = asyncio.Event()
        self.joined = asyncio.Event()
        self.channel: str | None = None
        self.tasks: list[asyncio.Task] = []
        self.reads: dict[tuple, asyncio.Future] = {}  # (viewer, after) → the log read under way

    # -- arrivals --------------------------------------------------------------------------------

    def notify(self, seq: int, wire: dict | None = None) -> None:
        if not isinstance(seq, int):
            return
        if wire is not None and seq > self.through and len(self.pushed) < PAGE:
            self.pushed[seq] = wire
        if seq > self.target:
            self.target = seq
        self.wake.set()

    async def receive(self) -> None:
        """This feed's channel: pushed events, relay pokes, the session's access changes."""
        layer = self.fanout.layer
        while self.fanout.feeds.get(self.session_id) is self:
            try:
                message = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:  # a layer hiccup: whatever was lost is in the log
                log.warning("channel layer read failed for session %s; reading the log", self.session_id,
                            exc_info=True)
                await asyncio.sleep(0.5)
                await self.fanout.resync([self])
                continue
            kind = message.get("type")
            if kind == "collab.event":
                for wire in pushed_wires(message):
                    self.notify(wire.get("seq"), wire)
            elif kind == "collab.poke":
                self.notify(message.get("seq"))
            elif kind == "collab.access_changed":
                await self.fanout.recheck(list(self.subs), message)  # never raises: it fails closed

    # -- delivery --------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            try:
                await self.advance()
            except asyncio.CancelledError:
                raise
            except Exception:  # a locked or restarting database: try again shortly
                log.warning("live fan-out of session %s failed; retrying", self.session_id, exc_info=True)
                await asyncio.sleep(0.5)
                self.wake.set()

    async def advance(self) -> None:
        """Deliver every event up to ``target`` to the live subscribers, in order."""
        while True:
            live = [s for s in self.subs if s.live]
            if not live:
                self.pushed.clear()  # the log has them for whoever comes
                return
            base = min(s.last_seq for s in live)
            for seq in [s for s in self.pushed if s <= base]:
                del self.pushed[seq]
            if self.target <= base:
                return
            wires, seq = [], base + 1
            while seq in self.pushed and len(wires) < PAGE:
                wires.append(self.pushed.pop(seq))
                seq += 1
            if not wires:  # a gap (a lost or late push, a poke): the log, once for everyone
                wires = await _log_after(self.session_id, base)
                if not wires:
                    self.target = base
                    return
                self.target = max(self.target, wires[-1]["seq"])
            await self.deliver(wires)

    async def deliver(self, wires: list[dict]) -> None:
        """Send ``wires`` (consecutive, from the log) to each live subscriber that is due them."""
        last = wires[-1]["seq"]
        self.through = max(self.through, last)  # before any await: see ``read_for``
        targets = [s for s in self.subs if s.live and s.last_seq < last]
        if not targets:
            return
        viewers = {s.key: s.viewer for s in targets}
        if names_no_other_session(self.session_id, wires, self.memo):
            shown = {key: wires for key in viewers}  # the same for every viewer: no query
        else:
            shown = await _redact_for(viewers, self.session_id, wires, self.memo)
        encoded: dict[int, list[tuple[int, str]]] = {}  # one encoding per distinct redaction
        frames = {}
        for key, shown_wires in shown.items():
            if id(shown_wires) not in encoded:
                encoded[id(shown_wires)] = [(w["seq"], json.dumps(w)) for w in shown_wires]
            frames[key] = encoded[id(shown_wires)]
        for sub in targets:
            for seq, text in frames[sub.key]:
                if sub not in self.subs or not sub.live:
                    break
                if seq <= sub.last_seq:
                    continue
                if seq != sub.last_seq + 1:  # it missed one (it went live mid-delivery): the log
                    sub.catch_up()
                    break
                sub.last_seq = seq
                await sub.send(text)

    async def read_log(self, sub: Subscriber) -> list[dict]:
        """The log after ``sub.last_seq`` as its viewer sees it (a page). Sockets of one viewer
        reading from the same seq share one read — a reconnect storm after a restart costs one
        query per (viewer, seq), not one per socket. Sharing a read that began before this socket
        subscribed loses nothing: what it does not return was committed after it began, so after
        the feed joined the group, and reaches this socket as a live frame (or through another
        read when the feed has delivered it already: ``through``)."""
        key = (sub.key, sub.last_seq)
        read = self.reads.get(key)
        if read is None:
            read = self.reads[key] = asyncio.ensure_future(
                _events_after(self.session_id, sub.last_seq, PAGE, viewer=sub.viewer, memo=self.memo))
            read.add_done_callback(lambda done: self.reads.pop(key, None) if self.reads.get(key) is done else None)
        return await asyncio.shield(read)  # one reader going away does not cancel the others' read

    async def read_for(self, sub: Subscriber) -> None:
        """A subscriber's own catch-up: the log after its ``last_seq``, redacted for its viewer,
        until it has read through what the feed has started to deliver; then it is live."""
        try:
            while sub in self.subs and not sub.held:
                sub.again = False
                wires = await self.read_log(sub)
                for wire in wires:
                    if sub not in self.subs or sub.held:
                        return
                    if wire["seq"] == sub.last_seq + 1:
                        sub.last_seq = wire["seq"]
                        await sub.send(json.dumps(wire))
                if sub.held:
                    return
                if len(wires) < PAGE and (sub.last_seq >= self.through or not wires) and not sub.again:
                    sub.live = True  # no await since the check: the feed sends it the next one
                    if self.target > sub.last_seq:
                        self.wake.set()
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # a locked database: the next push, poke or safety check retries
            log.warning("catching up a socket on session %s failed", self.session_id, exc_info=True)
            if not sub.held:
                sub.live = True
                self.wake.set()


class Fanout:
    """This event loop's feeds (one per session its sockets follow) and its sockets' users."""

    def __init__(self):
        self.layer = get_channel_layer()
        self.feeds: dict[str, Feed] = {}
        self.users: dict[int, dict] = {}  # user pk → {"subs": {Subscriber: None}, "channel", "task"}
        self.relay = relay()
        self.watchdog: asyncio.Task | None = None

    async def subscribe(self, consumer, session_id: str, viewer, after: int) -> Subscriber:
        """Follow ``session_id`` for ``consumer`` from ``after`` (the caller authorized it): the log
        after ``after`` first, then the live events. Cancelled half-way (the socket's application
        cancelled while the layer is slow), it leaves nothing behind."""
        feed = await self._feed(session_id, after)
        sub = Subscriber(feed, consumer, viewer, after)
        feed.subs[sub] = None
        try:
            await self._join_user(sub)
        except BaseException:
            await self.unsubscribe(sub)
            raise
        self._start_watchdog()
        sub.catch_up()
        return sub

    async def _feed(self, session_id: str, after: int) -> Feed:
        """The session's feed, joined to the session's group (made now if there is none)."""
        while True:
            feed = self.feeds.get(session_id)
            if feed is None:
                feed = self.feeds[session_id] = Feed(self, session_id)
                feed.target = feed.through = after
                loop = asyncio.get_running_loop()
                try:
                    if self.layer is not None:
                        feed.channel = await self.layer.new_channel()
                        await self.layer.group_add(session_group(session_id), feed.channel)
                        feed.tasks.append(loop.create_task(feed.receive()))
                except BaseException:
                    if self.feeds.get(session_id) is feed:
                        del self.feeds[session_id]
                    if feed.channel:
                        await self._quietly(self.layer.group_discard(session_group(session_id), feed.channel))
                    raise
                finally:
                    feed.joined.set()
                feed.tasks.append(loop.create_task(feed.run()))
                if self.relay:
                    self.relay.watch(session_id, after)
            await feed.joined.wait()  # pushes after this point reach the feed: the log covers the rest
            if self.feeds.get(session_id) is feed:
                return feed
            # its maker could not join the group (or was cancelled): try again

    async def unsubscribe(self, sub: Subscriber) -> None:
        feed = sub.feed
        if feed.subs.pop(sub, "gone") == "gone":
            return
        stopping = [sub.reading]
        mine = self.users.get(sub.key)
        discards = []
        if mine is not None:
            mine["subs"].pop(sub, None)
            if not mine["subs"]:
                del self.users[sub.key]
                stopping.append(mine["task"])
                if mine["channel"]:
                    discards.append(self.layer.group_discard(user_group(sub.key), mine["channel"]))
        if not feed.subs and self.feeds.get(feed.session_id) is feed:
            del self.feeds[feed.session_id]
            stopping += feed.tasks
            if self.relay:
                self.relay.unwatch(feed.session_id)
            if not self.feeds:
                stopping.append(self.watchdog)
                self.watchdog = None  # the next socket starts another
            if feed.channel:
                discards.append(self.layer.group_discard(session_group(feed.session_id), feed.channel))
        stopped = _stop(stopping)
        for discard in discards:
            await self._quietly(discard)
        await stopped

    @staticmethod
    async def _quietly(coro) -> None:
        try:
            await coro
        except Exception:  # a layer that is down forgets nothing we need: group members expire
            log.warning("channel layer call failed", exc_info=True)

    async def _join_user(self, sub: Subscriber) -> None:
        while True:
            mine = self.users.get(sub.key)
            if mine is None:
                mine = self.users[sub.key] = {"subs": {}, "channel": None, "task": None, "joined": asyncio.Event()}
                try:
                    if self.layer is not None and sub.key is not None:
                        mine["channel"] = await self.layer.new_channel()
                        await self.layer.group_add(user_group(sub.key), mine["channel"])
                        mine["task"] = asyncio.get_running_loop().create_task(self._receive_user(sub.key, mine))
                except BaseException:
                    if self.users.get(sub.key) is mine:
                        del self.users[sub.key]
                    if mine["channel"]:
                        await self._quietly(self.layer.group_discard(user_group(sub.key), mine["channel"]))
                    raise
                finally:
                    mine["joined"].set()
            await mine["joined"].wait()
            if self.users.get(sub.key) is mine:
                mine["subs"][sub] = None
                return

    async def _receive_user(self, key, mine: dict) -> None:
        while self.users.get(key) is mine:
            try:
                message = await self.layer.receive(mine["channel"])
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("channel layer read failed for a user's sockets", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            kind = message.get("type")
            subs = list(mine["subs"])
            if kind == "collab.access_changed":
                await self.recheck(subs, message)  # never raises: it fails closed
            elif kind == "collab.token_revoked":
                for sub in subs:
                    try:
                        await sub.consumer.collab_token_revoked(message)
                    except Exception:  # one socket's close failing must not spare the others
                        log.warning("closing a socket of a revoked token failed", exc_info=True)

    async def recheck(self, subs: list[Subscriber], message: dict) -> None:
        """Access changed: check it once per (viewer, session), close the sockets that lost it.
        The sockets get nothing while their check runs (an event committed after a removal is
        never sent to the removed person); a check that fails (the database is unreachable)
        closes them too (1011: the client reconnects and is authorized afresh). Never raises."""
        subs = [sub for sub in subs if sub in sub.feed.subs]
        for sub in subs:
            sub.hold()
        verdicts: dict = {}
        try:
            for sub in subs:
                key = (sub.key, sub.feed.session_id)
                if key not in verdicts:
                    try:
                        verdicts[key] = await sub.consumer.still_allowed(message)
                    except Exception:
                        log.warning("could not check a socket's access again: closing it", exc_info=True)
                        verdicts[key] = UNKNOWN
                try:
                    if verdicts[key] is False:
                        await sub.consumer.lost_access()
                    elif verdicts[key] is UNKNOWN:
                        await sub.consumer.access_unknown()
                except Exception:
                    log.warning("closing a socket that lost its access failed", exc_info=True)
        finally:
            for sub in subs:
                sub.release()

    def _start_watchdog(self) -> None:
        if self.watchdog is None or self.watchdog.done():
            self.watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """The safety net under the pushes, and the hourly re-join of the groups."""
        rejoined = time.monotonic()
        while self.feeds:
            await asyncio.sleep(SAFETY_SECONDS)
            await self.resync(list(self.feeds.values()))
            if self.layer is not None and time.monotonic() - rejoined > REJOIN_SECONDS:
                rejoined = time.monotonic()
                for feed in list(self.feeds.values()):
                    if feed.channel:
                        await self._quietly(self.layer.group_add(session_group(feed.session_id), feed.channel))
                for key, mine in list(self.users.items()):
                    if mine["channel"]:
                        await self._quietly(self.layer.group_add(user_group(key), mine["channel"]))

    async def resync(self, feeds: list[Feed]) -> None:
        """Read the feeds' event counters (one query) and deliver whatever is missing."""
        if not feeds:
            return
        try:
            seqs = await current_seqs([f.session_id for f in feeds])
        except Exception:
            log.warning("could not read the event counters", exc_info=True)
            return
        for feed in feeds:
            if feed.session_id in seqs:
                feed.notify(seqs[feed.session_id])


def _stop(tasks: list) -> "asyncio.Future":
    """Cancel some of the fan-out's tasks — never the one running (a socket closed from a message
    that task is handling — access lost, token revoked — must still be closed; that task ends by
    itself once it sees it has nothing left to serve). Returns what to await for them to have
    ended: a task left pending when its event loop closes never runs its cleanup — a channel
    layer's ``receive`` would then count a receiver on a dead loop forever, and refuse every
    later loop's (a test process runs one loop per test)."""
    current = asyncio.current_task()
    tasks = [task for task in tasks if task is not None and task is not current and not task.done()]
    for task in tasks:
        task.cancel()
    return asyncio.gather(*tasks, return_exceptions=True)


_fanouts: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Fanout]" = weakref.WeakKeyDictionary()


def fanout() -> Fanout:
    """This event loop's fan-out."""
    loop = asyncio.get_running_loop()
    if loop not in _fanouts:
        _fanouts[loop] = Fanout()
    return _fanouts[loop]

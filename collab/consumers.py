"""The session event stream: ``/ws/sessions/{sid}/?after=SEQ`` (docs/contract.md#events).

First the logged events after ``SEQ``, then the same events live, in ``seq`` order with no gaps
and no repeats, each as its viewer may see it. The consumer authorizes the socket and
subscribes it to this process's fan-out (``collab.realtime.fanout``), which reads each event once
for all the process's sockets on the session, redacts it once per viewer and sends the frames;
a socket that falls behind reads the missing events from the log.
"""

import asyncio
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from collab.access import access_session, as_now
from collab.errors import DomainError
from collab.realtime.bounds import WEBSOCKET_REFUSED, open_wait
from collab.realtime.fanout import fanout
from collab.services.members import EVERY_PROJECT
from collab.text import loads_bounded

MAX_FRAME_CHARS = 4096  # a client's frame (it only ever asks to catch up)
_ending: set = set()


def _after(scope) -> int:
    raw = parse_qs(scope.get("query_string", b"").decode()).get("after", ["0"])[0]
    try:
        return max(int(raw), 0)
    except ValueError:
        return 0


def _may_still_see(user, sid: str) -> bool:
    """Whether the person, as they are now (the socket's user row was read when it opened), may
    see the session."""
    user = as_now(user)
    if user is None:
        return False
    try:
        access_session(user, sid)
    except DomainError:
        return False
    return True


class SessionConsumer(AsyncJsonWebsocketConsumer):
    # No channel of its own: the fan-out's channels receive the session's events and the
    # user's access changes for every socket of the process, and call the methods below.
    channel_layer_alias = "trellis.none"
    subscription = None
    _expiry = None  # the timer that closes a socket opened with an expiring token
    _stream = None  # its slot among the user's long-lived connections (collab.realtime.bounds)

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # also when the application is cancelled (daphne, or a test, gave up waiting for it
            # to end) and ``disconnect`` never ran: the process's feed forgets this socket
            await self.unsubscribe()

    async def connect(self):
        self.sid = self.scope["url_route"]["kwargs"]["sid"]
        try:
            session = await database_sync_to_async(access_session)(self.scope.get("user"), self.sid)
        except DomainError:
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.project_id = session.project_id
        await self.accept()
        try:  # one of the user's long-lived connections in this process
            self._stream = open_wait(self.scope["user"])
        except DomainError:
            await self.close(code=WEBSOCKET_REFUSED)  # after accept: the client sees why
            return
        # Never past the log's end: a client's ?after= beyond it would make this socket (and the
        # process's feed and relay, which start from it) skip every event up to that number.
        after = min(_after(self.scope), session.last_event_seq)
        self.subscription = await fanout().subscribe(self, self.sid, self.scope.get("user"), after)
        self._close_at_expiry()

    def _close_at_expiry(self) -> None:
        """A socket opened with a token that expires closes (4401) when it does, as a revoked
        one does: a token's expiry is when everything it opened ends."""
        expires_at = self.scope.get("api_token_expires_at")
        if expires_at is None:
            return
        delay = max(0.0, (expires_at - timezone.now()).total_seconds())
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(delay, self._expired)

    def _expired(self) -> None:
        task = asyncio.get_running_loop().create_task(self._end(4401))
        _ending.add(task)  # kept until it has run: the loop holds tasks only weakly
        task.add_done_callback(_ending.discard)

    async def disconnect(self, code):
        await self.unsubscribe()

    async def unsubscribe(self):
        if self._stream is not None:
            self._stream.free()
            self._stream = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self.subscription is not None:
            subscription, self.subscription = self.subscription, None
            await subscription.cancel()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """The stream is one-way; a client may ask to be brought up to date (``{"type":
        "catch_up"}``). A frame that is not such a JSON object — binary, not JSON, too long, too
        deep — is answered with an ``error`` frame (no ``seq``: not an event) and the socket
        stays open."""
        try:
            content = loads_bounded(text_data, max_chars=MAX_FRAME_CHARS) if text_data is not None else None
        except (ValueError, RecursionError):
            content = None
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "code": "invalid_frame",
                                  "detail": f'a frame is a JSON object of at most {MAX_FRAME_CHARS} characters, '
                                            'e.g. {"type": "catch_up"}'})
            return
        if content.get("type") == "catch_up" and self.subscription is not None:
            self.subscription.catch_up()

    async def still_allowed(self, message) -> bool | None:
        """A membership of this user, the session's visibility, or the user's account (deactivated,
        deleted) changed: may they still see the session? None when the change is about another
        project (nothing to check)."""
        if message.get("project") not in (EVERY_PROJECT, self.project_id):
            return None
        return await database_sync_to_async(_may_still_see)(self.scope.get("user"), self.sid)

    async def lost_access(self):
        """Nothing more is sent; the socket closes (4403)."""
        await self._end(4403)

    async def access_unknown(self):
        """Its access could not be checked again (the database is unreachable): the socket closes
        (1011), and the client reconnects and is authorized afresh — never left open unchecked."""
        await self._end(1011)

    async def collab_token_revoked(self, message):
        """The bearer token this socket was opened with was revoked: close at once."""
        if self.scope.get("api_token_id") == message.get("token"):
            await self._end(4401)

    async def _end(self, code: int):
        """Close now — nothing more is sent from here on — then leave the feed (the layer's
        cleanup may be slow; the close never waits for it)."""
        if self.subscription is not None:
            self.subscription.hold()
        await self.close(code=code)
        await self.unsubscribe()

"""The session event stream: ``/ws/sessions/{sid}/?after=SEQ`` (SPEC §11.1).

First the logged events after ``SEQ``, then the same events live, in ``seq``
order with no gaps and no repeats: a pushed event that does not follow the last
one sent makes the consumer read the missing ones from the log.
"""

from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from collab.access import access_session
from collab.errors import DomainError
from collab.events import session_group
from collab.live import relay
from collab.services.members import user_group
from collab.selectors.events import PAGE, events_after
from collab.selectors.redact import Memo, redact_wires


def _after(scope) -> int:
    raw = parse_qs(scope.get("query_string", b"").decode()).get("after", ["0"])[0]
    try:
        return max(int(raw), 0)
    except ValueError:
        return 0


class SessionConsumer(AsyncJsonWebsocketConsumer):
    group = None

    async def connect(self):
        self.sid = self.scope["url_route"]["kwargs"]["sid"]
        try:
            session = await database_sync_to_async(access_session)(self.scope.get("user"), self.sid)
        except DomainError:
            await self.close()  # before accept: the handshake is refused (HTTP 403)
            return
        self.project_id = session.project_id
        # Never past the log's end: a client's ?after= beyond it would make this socket (and the
        # process's relay, which shares its watermark) skip every event up to that number.
        self.last_seq = min(_after(self.scope), session.last_event_seq)
        self.memo = Memo()  # which session each branch / job named in an event is in (never changes)
        self.group = session_group(self.sid)
        self.user_group = user_group(self.scope["user"].pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.accept()
        self.relay = relay()
        if self.relay:
            self.relay.watch(self.sid, self.last_seq)
        await self.catch_up()

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            await self.channel_layer.group_discard(self.user_group, self.channel_name)
            if self.relay:
                self.relay.unwatch(self.sid)

    async def receive_json(self, content, **kwargs):
        # The stream is one-way; a client may ask to be brought up to date.
        if isinstance(content, dict) and content.get("type") == "catch_up":
            await self.catch_up()

    async def catch_up(self):
        while True:
            events = await database_sync_to_async(events_after)(self.sid, self.last_seq, PAGE,
                                                                viewer=self.scope.get("user"), memo=self.memo)
            for wire in events:
                await self.send_json(wire)
                self.last_seq = wire["seq"]
            if len(events) < PAGE:
                return

    async def collab_event(self, message):
        wire = message["event"]
        if wire["seq"] <= self.last_seq:
            return
        if wire["seq"] == self.last_seq + 1:
            # as this viewer may see it: a field naming a session they may not see is blanked (issue 17)
            [wire] = await database_sync_to_async(redact_wires)(self.scope.get("user"), self.sid, [wire], self.memo)
            await self.send_json(wire)
            self.last_seq = wire["seq"]
        else:
            await self.catch_up()

    async def collab_poke(self, message):
        if message.get("seq", 0) > self.last_seq:
            await self.catch_up()

    async def collab_access_changed(self, message):
        """A membership of this user changed: re-check, and close if the session is no longer visible."""
        if message.get("project") != self.project_id:
            return
        try:
            await database_sync_to_async(access_session)(self.scope.get("user"), self.sid)
        except DomainError:
            await self.close(code=4403)

    async def collab_token_revoked(self, message):
        """The bearer token this socket was opened with was revoked: close at once."""
        if self.scope.get("api_token_id") == message.get("token"):
            await self.close(code=4401)

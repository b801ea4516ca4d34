"""Everything that carries events to whoever waits for them, and every bound on waiting.

- ``push``: after a commit, a session's new events go to its channel-layer group as one message;
  on the embedded default other processes' relays are woken (a datagram). The log itself — the
  statements that number and write events — is ``collab.events``.
- ``relay``: on the embedded default, a web process's watch of the sessions its listeners follow,
  poking their groups when another process wrote events there.
- ``fanout``: one reader per session per process for every WebSocket following it.
- ``subscription``: the one subscription a wait on the event loop listens on — ``?wait=``, SSE
  streams, the gateway's foreground calls (``until_terminal``).
- ``changes``: the same wait in a thread, on the event log's counters (``wait_for_change``:
  blocking ``job_output``, ``wait_agent``, the gateway's calls that wait in a thread).
- ``threads``: what a waiting request holds under ASGI (neither its thread nor its connection).
- ``bounds``: how long each wait may last and how many one user may hold open.

The modules sit in different layers (``[tool.importlinter]`` in pyproject.toml): ``push`` and
``bounds`` beside the event log, ``changes`` beside the services, the rest with the routes and
consumers. This module imports nothing.
"""

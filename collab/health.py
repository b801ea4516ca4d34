"""Probes for a load balancer or an orchestrator (no login, no session, no CSRF).

- ``GET /healthz``: the process answers (liveness). Touches nothing else, so a slow database
  never gets a healthy web process restarted.
- ``GET /readyz``: this web process can serve: the database answers a query and the channel
  layer carries a message to itself and back (readiness). 200 with ``{"ok": true, ...}``, or 503
  naming what failed — a load balancer takes the process out of rotation until it recovers.

Both are async views: under daphne they hold no thread while waiting, and each check is
bounded by ``TIMEOUT`` seconds so a stuck dependency answers 503 instead of hanging the probe.
"""

import asyncio
import time

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.cache import never_cache

TIMEOUT = 3.0


@never_cache
async def healthz(request):
    return JsonResponse({"ok": True})


def _database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        connection.close()


async def _channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured")
    channel = await layer.new_channel("readyz.")
    await layer.send(channel, {"type": "readyz.ping"})
    message = await layer.receive(channel)
    if message.get("type") != "readyz.ping":
        raise RuntimeError("the channel layer returned another message")


async def _check(name: str, probe) -> dict:
    started = time.monotonic()
    try:
        await asyncio.wait_for(probe(), TIMEOUT)
    except TimeoutError:
        return {"name": name, "ok": False, "error": f"no answer within {TIMEOUT:g} s"}
    except Exception as exc:  # a probe reports any failure as "not ready", never as a 500
        return {"name": name, "ok": False, "error": type(exc).__name__}
    return {"name": name, "ok": True, "ms": round((time.monotonic() - started) * 1000, 1)}


@never_cache
async def readyz(request):
    checks = await asyncio.gather(
        _check("database", sync_to_async(_database, thread_sensitive=False)),
        _check("channel_layer", _channel_layer),
    )
    ok = all(c["ok"] for c in checks)
    return JsonResponse({"ok": ok, "checks": {c.pop("name"): c for c in checks}}, status=200 if ok else 503)

#!/usr/bin/env python
"""The cost of one event push from a worker's thread, on each path the Redis channel layer offers
(docs/infrastructure.md: ``channel_layer`` and ``push_loop``), measured alone.

    REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python bench/push.py [--pushes 2000] [--pairs 5]

A worker's turn pushes its committed events to the session's group (``collab.realtime.push``),
from a plain thread, about three times a turn. This bench pushes ``--pushes`` one-event messages
of a turn's size to a group one listener is in (another process, which drains its channel as a
socket's feed would), from the main thread of a fresh process per run, and prints per push the
pushing process's CPU (``time.process_time``: every thread of it — the push loop's, and the
threads ``async_to_sync`` starts) and the wall time, for:

- ``channel_layer``: Trellis's path — the layer's blocking ``group_send`` (redis-py, one or two
  round trips);
- ``push_loop``: ``TRELLIS_STOCK=channel_layer`` — channels-redis's ``group_send`` on the
  process's one push loop;
- ``stock``: ``TRELLIS_STOCK=channel_layer,push_loop`` — ``async_to_sync(group_send)`` per push, as
  Channels documents for sync code.

Runs alternate (``--pairs`` rounds, the order rotating) so that the host's drift falls on every
path alike; the medians are printed beside the spread of each path's own runs. CPU time is what
the process itself spent, so it is much less moved by other load on the machine than the wall.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PATHS = {"channel_layer": "", "push_loop": "channel_layer", "stock": "channel_layer,push_loop"}


def _setup(stock: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench")
    os.environ["TRELLIS_STOCK"] = stock
    import django

    django.setup()


def phase_push(args) -> None:
    """In a fresh process: ``--pushes`` pushes to ``--group``; prints CPU and wall per push."""
    _setup(PATHS[args.path])
    from collab.realtime.push import push_events, warm_push

    warm_push(wait=5)
    wire = {"seq": 0, "type": "message.created", "session": "bench", "created_at": "2026-12-06T00:00:00Z",
            "payload": {"id": "m" * 12, "role": "assistant", "branch": "b" * 12, "content": "x" * 400}}
    for seq in range(20):  # warm: connections, the loop, the scripts
        push_events(args.group, [{**wire, "seq": seq}])
    cpu, wall = time.process_time(), time.perf_counter()
    for seq in range(args.pushes):
        push_events(args.group, [{**wire, "seq": seq}])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu_ms": cpu * 1000 / args.pushes, "wall_ms": wall * 1000 / args.pushes}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=5, help="rounds of one run per path, the order rotating")
    parser.add_argument("--phase", choices=["push"], help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=list(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "push":
        return phase_push(args)
    if not os.environ.get("REDIS_URL"):
        raise SystemExit("set REDIS_URL: this bench times the Redis channel layer's paths")

    import asyncio
    import threading

    _setup("channel_layer")  # the listener: channels-redis's own layer, on its own loop
    from channels.layers import get_channel_layer

    from collab.realtime.push import session_group

    layer = get_channel_layer()
    group_id = f"bench-push-{os.getpid()}"
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    received = [0]

    async def listen():
        channel = await layer.new_channel()
        await layer.group_add(session_group(group_id), channel)
        ready.set()
        while True:
            await layer.receive(channel)
            received[0] += 1

    ready = threading.Event()
    asyncio.run_coroutine_threadsafe(listen(), loop)
    ready.wait(10)

    names = list(PATHS)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rnd in range(args.pairs):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            out = subprocess.run([sys.executable, __file__, "--phase", "push", "--path", name, "--group", group_id,
                                  "--pushes", str(args.pushes)], cwd=ROOT, capture_output=True, text=True,
                                 check=True, env=dict(os.environ))
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.pushes} pushes per run, {args.pairs} runs per path; listener received {received[0]:,} messages")
    print(f"{'path':<15} {'CPU ms/push (median, spread)':<32} {'wall ms/push (median, spread)':<32} runs (CPU)")
    for name in names:
        line = [f"{name:<15}"]
        for key in ("cpu_ms", "wall_ms"):
            values = [r[key] for r in runs[name]]
            med = statistics.median(values)
            line.append(f"{med:8.3f} ({(max(values) - min(values)) / med:5.1%}){'':<16}")
        line.append(" ".join(f"{r['cpu_ms']:.3f}" for r in runs[name]))
        print(" ".join(line))


if __name__ == "__main__":
    main()

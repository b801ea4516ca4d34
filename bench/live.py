#!/usr/bin/env python
"""Live events (the "Live" target of docs/performance.md#targets):
commit → WebSocket client latency with many clients, on the Redis layer and on the embedded
default, measured on this machine in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/14 \\
      .venv/bin/python bench/live.py [--clients 200] [--events 100] [--gap-ms 20]

For each layout it starts a real daphne process (``config.asgi``), opens ``--clients`` WebSocket
clients on one session's stream (``/ws/sessions/{sid}/?after=SEQ``, bearer token; a minimal
RFC 6455 client in this process, one asyncio connection each), then a separate *committer*
process — standing for a worker — appends ``--events`` messages to the session, one transaction
each (``services.messages.append_message``: one ``message.created`` event), ``--gap-ms`` apart.
The committer stamps each event's commit (an on-commit hook that runs before the push); every
client stamps its arrival; the figure is arrival − commit over every (client, event) pair:
p50, p99 and the worst, and how many never arrived. Beside them, the CPU time the web process
spent from the first commit until every client had the last event (``/proc``), per event and
per event per socket: unlike the latencies it hardly depends on what else loads the machine.

Layouts:

- ``redis``: PostgreSQL + the channels-redis layer (``<db>_bench_live`` next to DATABASE_URL's):
  the committer's push goes through Redis to the web process. Target: p99 ≤ 100 ms with 200 clients.
- ``embedded``: the embedded default — a SQLite file, the in-memory layer in each process, and
  the web process's database relay (``collab/realtime/relay.py``) carrying the committer's events across.
  Measured with the relay's cross-process wake-up (the committer's datagram after commit) and,
  for comparison, without it (``TRELLIS_EVENT_NOTIFY=0``: the relay's poll alone, every
  ``TRELLIS_EVENT_POLL_MS``).

Prints the machine's raw single-row INSERT+COMMIT rate from the same run (PostgreSQL, and the
SQLite file with the embedded default's pragmas) beside the figures.
"""

import argparse
import asyncio
import base64
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common  # noqa: E402

TARGET_P99_MS = 100


# --- the processes' phases (Django) -----------------------------------------------------------


def phase_setup(_args):
    """A user with a read token, a project, one session: prints sid, token, the log's last seq."""
    from django.contrib.auth import get_user_model

    from accounts.models import ApiToken, Membership, Project, TokenScope
    from collab.services.sessions import do_create_session

    user, _ = get_user_model().objects.get_or_create(username="bench")
    project, _ = Project.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    Membership.objects.get_or_create(user=user, project=project, defaults={"role": "owner"})
    session = do_create_session(user, project, title="live")
    session.refresh_from_db()
    _, raw = ApiToken.issue(user, name="bench-live", scopes=TokenScope.values)
    print(f"sid={session.pk}")
    print(f"token={raw}")
    print(f"seq={session.last_event_seq}")


def phase_commit(args):
    """Append ``--events`` messages to the session's main branch, one transaction each, and print
    ``seq:commit time`` of each event (the stamp is an on-commit hook registered before the push)."""
    from django.db import transaction

    from collab.realtime.push import warm_push
    from collab.models import Branch, Event
    from collab.services.locking import lock_for_branch
    from collab.services.messages import append_message

    branch = Branch.objects.get(session_id=args.sid, name="main")
    # like a worker process, which opens its push loop and channel-layer connection as it starts
    # (collab.apps): otherwise the first event carried that set-up (~57 ms here) to every client
    warm_push(wait=10)
    stamps = []
    for i in range(args.events):
        stamp = {}
        with transaction.atomic():
            transaction.on_commit(lambda stamp=stamp: stamp.__setitem__("t", time.time()))
            locked = lock_for_branch(branch.pk)
            message = append_message(locked, role="user", text=f"live bench event {i}: " + "lorem ipsum " * 20)
        seq = Event.objects.filter(session_id=args.sid, type="message.created",
                                   payload__id=message.pk).values_list("seq", flat=True).get()
        stamps.append(f"{seq}:{stamp['t']:.6f}")
        time.sleep(args.gap_ms / 1000)
    print("stamps=" + ",".join(stamps))


# --- a minimal WebSocket client (RFC 6455: the handshake, and unmasked frames from the server) --


async def ws_open(port: int, path: str, token: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2 ** 22)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                  f"Authorization: Bearer {token}\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"handshake refused: {head[:200]!r}")
    return reader, writer


async def ws_messages(reader):
    """Yield each text message the server sends, until it closes."""
    buffered = b""
    while True:
        b1, b2 = await reader.readexactly(2)
        opcode, length = b1 & 0x0F, b2 & 0x7F
        if length == 126:
            length = int.from_bytes(await reader.readexactly(2), "big")
        elif length == 127:
            length = int.from_bytes(await reader.readexactly(8), "big")
        if b2 & 0x80:
            await reader.readexactly(4)  # servers do not mask; tolerated
        data = await reader.readexactly(length)
        if opcode == 8:
            return
        if opcode in (0, 1, 2):
            buffered += data
            if b1 & 0x80:
                yield buffered
                buffered = b""


async def client(port, sid, token, after, arrivals: dict, connected: asyncio.Event, count: list, total: int,
                 gate: asyncio.Semaphore):
    async with gate:  # a few handshakes at a time: daphne drops one not accepted within 5 s
        for attempt in range(10):
            try:
                reader, writer = await ws_open(port, f"/ws/sessions/{sid}/?after={after}", token)
                break
            except (ConnectionError, asyncio.IncompleteReadError, RuntimeError):
                if attempt == 9:
                    raise
                await asyncio.sleep(0.5)
    count[0] += 1
    if count[0] == total:
        connected.set()
    try:
        async for raw in ws_messages(reader):
            now = time.time()
            seq = json.loads(raw).get("seq")
            if seq is not None:
                arrivals.setdefault(seq, now)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def measure(port, env, setup, args, pid: int) -> dict:
    sid, token, after = setup["sid"], setup["token"], int(setup["seq"])
    connected, count = asyncio.Event(), [0]
    per_client = [dict() for _ in range(args.clients)]
    gate = asyncio.Semaphore(10)  # the handshakes are not what is measured
    tasks = [asyncio.create_task(client(port, sid, token, after, per_client[i], connected, count, args.clients, gate))
             for i in range(args.clients)]
    await asyncio.wait_for(connected.wait(), 600)
    await asyncio.sleep(1.0)  # every consumer has joined its group and read the (empty) log
    cpu_before = _common.cpu_seconds(pid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "bench/live.py", "--phase", "commit", "--sid", sid, "--events", str(args.events),
        "--gap-ms", str(args.gap_ms), cwd=_common.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode:
        raise SystemExit(out.decode() + err.decode())
    stamps = dict(line.split("=", 1) for line in out.decode().splitlines() if "=" in line)["stamps"]
    commits = {int(s): float(t) for s, t in (x.split(":") for x in stamps.split(","))}
    last = max(commits)
    deadline = time.monotonic() + 30
    while any(last not in c for c in per_client) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    cpu = _common.cpu_seconds(pid) - cpu_before  # the web process's work for the events (and its idle ticks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    latencies, missing, missed = [], 0, set()
    for arrivals in per_client:
        for seq, committed in commits.items():
            if seq in arrivals:
                latencies.append((arrivals[seq] - committed) * 1000)
            else:
                missing += 1
                missed.add(seq)
    by_event = {seq: sorted((a[seq] - t) * 1000 for a in per_client if seq in a) for seq, t in commits.items()}
    slowest = sorted(((lat[len(lat) // 2], seq) for seq, lat in by_event.items() if lat), reverse=True)[:3]
    print("slowest events (seq: median over clients): "
          + ", ".join(f"{seq}: {ms:.0f} ms" for ms, seq in slowest), file=sys.stderr)
    if missed:
        print(f"events some client never got: {sorted(missed)} (committed {sorted(commits)}); "
              f"per client: {[len(a) for a in per_client]}", file=sys.stderr)
    return {"latencies": latencies, "missing": missing, "events": len(commits), "cpu": cpu, "clients": args.clients}


# --- orchestration ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daphne(env: dict, port: int, log):
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
                            env=env, cwd=_common.ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("daphne did not start") from None
            time.sleep(0.1)


def run_layout(env: dict, args) -> dict:
    # the clients are one user standing in for as many people: their sockets are above one
    # person's bound on long-lived connections (TRELLIS_MAX_OPEN_STREAMS_PER_USER, 32)
    env = {**env, "TRELLIS_MAX_OPEN_STREAMS_PER_USER": str(max(32, args.clients))}
    setup = _common.child("live.py", "setup", env)
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = daphne(env, port, log)
        try:
            return asyncio.run(measure(port, env, setup, args, proc.pid))
        finally:
            _common.stop(proc, 15)
            log.seek(0)
            errors = [line for line in log.read().splitlines() if line.startswith("Exception inside application")]
            if errors:  # a consumer that died (its socket gets nothing more): say so beside the figures
                print(f"daphne: {len(errors)} consumer(s) died: {sorted(set(errors))}", file=sys.stderr)


def sqlite_raw_rate(path: str, n: int = 2000) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE bench_raw (id integer primary key, v text)")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO bench_raw (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.execute("DROP TABLE bench_raw")
    conn.close()
    return n / elapsed


def rows_for(label: str, r: dict, target: str) -> list:
    lat = r["latencies"]
    rows = [
        (f"{label} commit→client p50", f"{_common.percentile(lat, 0.5):.1f} ms", ""),
        (f"{label} commit→client p99", f"{_common.percentile(lat, 0.99):.1f} ms", target),
        (f"{label} commit→client worst", f"{max(lat):.1f} ms", ""),
    ]
    per_event = r["cpu"] / max(r["events"], 1)
    rows.append((f"{label} web process CPU per event", f"{per_event * 1000:.1f} ms", "(load-independent)"))
    rows.append((f"{label} web process CPU per event per socket", f"{per_event / r['clients'] * 1e6:.0f} µs", ""))
    if r["missing"]:
        rows.append((f"{label} deliveries missing", str(r["missing"]), "0"))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between two committed events")
    parser.add_argument("--layouts", nargs="+", default=["redis", "embedded", "embedded-poll"],
                        choices=["redis", "embedded", "embedded-poll"])
    parser.add_argument("--phase", choices=["setup", "commit"], help=argparse.SUPPRESS)
    parser.add_argument("--sid", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if _common.run_phase(args, {"setup": phase_setup, "commit": phase_commit}):
        return
    rows = []
    label = f"{args.clients} clients, {args.events} events"
    if "redis" in args.layouts:
        if not os.environ.get("REDIS_URL"):
            print("REDIS_URL is not set: the redis layout is skipped", file=sys.stderr)
        else:
            bench_url = _common.create_database("bench_live")
            try:
                rows.append(("raw single-row INSERT+COMMIT (PostgreSQL)", f"{_common.raw_insert_rate(bench_url):,.0f}/s",
                             "(machine)"))
                env = _common.bench_env(bench_url, "redis", tag="bench-live")
                rows += rows_for(f"[redis layer, PostgreSQL, {label}]", run_layout(env, args), f"<= {TARGET_P99_MS} ms")
            finally:
                _common.drop_database(bench_url)
    for layout in [x for x in args.layouts if x.startswith("embedded")]:
        var = tempfile.mkdtemp(prefix="trellis-bench-live-")
        db = f"{var}/bench.sqlite3"
        rows.append((f"raw single-row INSERT+COMMIT (SQLite WAL, {layout})", f"{sqlite_raw_rate(db):,.0f}/s", "(machine)"))
        env = dict(os.environ, DATABASE_URL=f"sqlite:///{db}", DJANGO_SECRET_KEY="bench", TRELLIS_VAR_DIR=var,
                   TRELLIS_LOG_LEVEL="WARNING", TRELLIS_QUEUE_NAME=f"bench-live-{os.getpid()}",
                   TRELLIS_EVENT_NOTIFY="0" if layout == "embedded-poll" else "1")
        env.pop("REDIS_URL", None)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=_common.ROOT, env=env, check=True)
        how = "relay poll only (before)" if layout == "embedded-poll" else "relay woken on commit"
        rows += rows_for(f"[embedded: in-memory layer + {how}, SQLite, {label}]", run_layout(env, args),
                         "no poll interval per event")
    _common.table(rows)


if __name__ == "__main__":
    main()

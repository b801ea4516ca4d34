"""Run the embedded deployment: the web server (daphne) and a worker (qcluster) together.

For the scaled deployment run ``daphne config.asgi:application`` and
``manage.py qcluster`` as separate services instead.

Quiet by default: daphne's access log (a line for every request, every
htmx fragment and every WebSocket handshake) is off and the worker logs warnings only.
``--verbose`` or ``TRELLIS_VERBOSE=1`` turns both back on.
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from collab.management.commands.demo import Command as Demo
from collab.conf.env import env_bool


def process_commands(python: str, manage: str, host: str, port: int, *, verbose: bool) -> list[tuple[list[str], dict]]:
    """(argv, extra environment) of the worker and the web server."""
    worker_env = {} if verbose else {"TRELLIS_WORKER_LOG_LEVEL": os.environ.get("TRELLIS_WORKER_LOG_LEVEL") or "WARNING"}
    daphne = [python, "-m", "daphne", "-b", host, "-p", str(port)]
    # daphne's verbosity 1 (its default) writes the access log to stdout; 0 keeps warnings only
    daphne += ["--access-log", "-"] if verbose else ["-v", "0"]
    return [([python, manage, "qcluster"], worker_env), ([*daphne, "config.asgi:application"], {})]


class Command(BaseCommand):
    help = "Migrate, ensure the demo data, then run web + worker until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true")
        parser.add_argument(
            "--verbose", action="store_true", default=env_bool("TRELLIS_VERBOSE", False),
            help="print every HTTP request and WebSocket connection (daphne's access log) and each task the "
                 "worker runs (also TRELLIS_VERBOSE=1)",
        )

    def handle(self, *args, host, port, no_demo, verbose, **options):
        call_command("migrate", interactive=False, verbosity=0)
        login = ""
        if not no_demo:
            demo = Demo(stdout=open(os.devnull, "w"))
            demo.handle(quiet=True)
            login = demo.login_line
        python = sys.executable
        manage = str(settings.BASE_DIR / "manage.py")
        procs = [
            subprocess.Popen(argv, env={**os.environ, **extra})
            for argv, extra in process_commands(python, manage, host, port, verbose=verbose)
        ]
        url = f"http://{host}:{port}/"
        self.stdout.write(self.style.SUCCESS(f"Trellis is running at {url}"))
        if login:
            self.stdout.write(f"Log in at {url} with {login}")
        self.stdout.write("Press Ctrl+C to stop.")
        self.stdout.flush()

        def stop(code=0):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + 10
            for p in procs:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
            sys.exit(code)

        signal.signal(signal.SIGTERM, lambda *_: stop(0))
        signal.signal(signal.SIGINT, lambda *_: stop(0))
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        names = ["worker", "web server"]
        failed = [f"{names[i]} (exit code {p.returncode})" for i, p in enumerate(procs) if p.poll() is not None]
        self.stderr.write(f"{', '.join(failed)} stopped unexpectedly; stopping Trellis")
        stop(1)

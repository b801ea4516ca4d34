"""Create (or refresh) the demo user, project, agent specs and session; print the login.

The demo user is an operator (staff + superuser) only on the embedded default (no
DATABASE_URL: one person's SQLite file on 127.0.0.1). On a DATABASE_URL deployment it
is an ordinary user, and an existing demo user there loses staff and superuser: a
login whose password sits in a file under var/ is never an admin of a shared
deployment.

The demo project holds one finished session that shows what Trellis does (``demo_session``):
the starter ``assistant`` spawns a researcher and a critic and sums up their results; a person's
fork asks the same for another case (and gets its own sub-agents); that fork is then archived.
Its turns really run, through the services and the worker's own ``run_job``, in this process
(``manage.py serve`` calls this before it starts a worker) — a second or so of scripted steps.
It is made once: a demo project that has it already is left alone."""

import logging
import secrets
from contextlib import contextmanager

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import Membership, Project, Role
from collab.access import access_message, access_session, require_can_archive
from collab.models import TERMINAL_STATUSES, Branch, Job, Session
from collab.realtime.changes import wait_for_change
from collab.runtime.loop import run_job
from collab.services.archive import do_archive_branch
from collab.services.projects import STARTER_AGENT_ID, do_add_starter_agents
from collab.services.sessions import do_create_session
from collab.services.turns import do_fork_and_start, do_start_user_turn

DEMO_USER = "demo"
DEMO_PROJECT = "demo"
DEMO_TITLE = "Welcome to Trellis"
DEMO_QUESTION = "How should our team start working with agents in Trellis?"
FORK_NAME = "what if: a team of one"
FORK_QUESTION = "And if I work alone: what changes?"
FORK_ARCHIVED_BECAUSE = "an alternative we looked at and did not keep"
TAKEN_BY_A_WORKER_WAIT_SECONDS = 60  # a worker of a running deployment took a turn first: wait for its end


class Command(BaseCommand):
    help = "Create the demo user, project, agents and session if missing and print how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--quiet", action="store_true", help="print only the login line")

    def handle(self, *args, quiet=False, **options):
        cred_file = settings.VAR_DIR / "demo-login.txt"
        User = get_user_model()
        with transaction.atomic():
            user = User.objects.filter(username=DEMO_USER).first()
            password = cred_file.read_text().strip() if cred_file.exists() else ""
            operator = not settings.DATABASE_URL
            if user is None or not password or not user.check_password(password):
                password = secrets.token_urlsafe(9)
                user = user or User(username=DEMO_USER, is_staff=operator, is_superuser=operator)
                user.set_password(password)
                user.save()
                cred_file.write_text(password)
                cred_file.chmod(0o600)
            if not operator and (user.is_staff or user.is_superuser):
                user.is_staff = user.is_superuser = False
                user.save(update_fields=["is_staff", "is_superuser"])
            project, _ = Project.objects.get_or_create(slug=DEMO_PROJECT, defaults={"name": "Demo project"})
            Membership.objects.get_or_create(user=user, project=project, defaults={"role": Role.OWNER})
            do_add_starter_agents(user, project)  # the agents every new project starts with
        with warnings_only("django-q"):  # its turns commit as they run, as on a worker: outside that transaction
            demo_session(user, project)
        self.login_line = f"login: {DEMO_USER} / {password}"
        if not quiet:
            self.stdout.write(f"Demo project ready: user {DEMO_USER!r}, project {DEMO_PROJECT!r}.")
        self.stdout.write(self.login_line)


def demo_session(user, project) -> Session:
    """The demo project's finished multi-agent session, made once (found again by its title):
    a turn of ``assistant`` with its two sub-agents and their results on *main*, a fork of *main*
    with a turn (and sub-agents) of its own, and that fork archived."""
    found = Session.objects.filter(project=project, title=DEMO_TITLE).first()
    if found is not None:
        return found
    session = do_create_session(user, project, title=DEMO_TITLE, agent_id=STARTER_AGENT_ID)
    session = access_session(user, session.pk, "turn.start")
    main = run_here(do_start_user_turn(user, session, DEMO_QUESTION))
    tip = Branch.objects.get(pk=main.branch_id).tip
    fork_at = access_message(user, session.pk, tip.pk, "turn.start")
    fork = run_here(do_fork_and_start(user, session, fork_at, FORK_QUESTION, name=FORK_NAME)).branch
    require_can_archive(user, fork)
    do_archive_branch(fork, user=user, reason=FORK_ARCHIVED_BECAUSE)
    return session


@contextmanager
def warnings_only(logger_name: str):
    """``logger_name`` says only warnings meanwhile. Each turn is handed to the broker as it is
    admitted (the worker finds it ended and does nothing); its "Enqueued" line is not news here
    (``manage.py serve`` keeps the terminal to warnings and errors)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def run_here(job: Job) -> Job:
    """Run ``job`` to its end in this process, as a worker runs it (``run_job``: its foreground
    sub-agents run inline, in its slot) — or, when a worker of a running deployment claimed it
    first, wait for that worker to end it."""
    if run_job(job.pk) is None:
        wait_for_change(lambda: Job.objects.filter(pk=job.pk, status__in=TERMINAL_STATUSES).exists(),
                        TAKEN_BY_A_WORKER_WAIT_SECONDS, sessions=[job.session_id])
    return Job.objects.select_related("branch").get(pk=job.pk)

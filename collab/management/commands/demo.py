"""Create (or refresh) the demo user, project, agent spec and session; print the login.

The demo user is an operator (staff + superuser) only on the embedded default (no
DATABASE_URL: one person's SQLite file on 127.0.0.1). On a DATABASE_URL deployment it
is an ordinary user, and an existing demo user there loses staff and superuser: a
login whose password sits in a file under var/ is never an admin of a shared
deployment."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from accounts.models import Membership, Project, Role
from collab.models import AgentSpec, Session
from collab.services.projects import STARTER_AGENT_ID, do_add_starter_agent
from collab.services.sessions import do_create_session

DEMO_USER = "demo"
DEMO_PROJECT = "demo"


class Command(BaseCommand):
    help = "Create the demo user/project/agent/session if missing and print how to log in."

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
            if not AgentSpec.objects.filter(project=project, agent_id=STARTER_AGENT_ID).exists():
                do_add_starter_agent(user, project)  # the agent every new project starts with
            if not Session.objects.filter(project=project).exists():
                do_create_session(user, project, title="Welcome", agent_id=STARTER_AGENT_ID)
        self.login_line = f"login: {DEMO_USER} / {password}"
        if not quiet:
            self.stdout.write(f"Demo project ready: user {DEMO_USER!r}, project {DEMO_PROJECT!r}.")
        self.stdout.write(self.login_line)

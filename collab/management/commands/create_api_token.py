from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from collab.errors import DomainError
from collab.services.tokens import do_issue_token


class Command(BaseCommand):
    help = ("Create an API token for USERNAME and print it (shown once; only its hash is stored). "
            "Lives in collab because issuing a token is audited in the user's projects.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label to tell tokens apart")
        parser.add_argument("--scopes", default="", help="comma-separated: read,write,tools,tokens,holds "
                                                         "(default read,write,tools)")
        parser.add_argument("--expires-in-days", type=int, default=None, help="unusable after this many days")

    def handle(self, *args, username, name, scopes, expires_in_days, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if expires_in_days is not None and expires_in_days <= 0:
            raise CommandError("--expires-in-days must be positive")
        expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
        try:
            _, raw = do_issue_token(None, user, name=name, expires_at=expires_at,
                                    scopes=[s.strip() for s in scopes.split(",") if s.strip()] or None)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(raw)

"""``manage.py adduser USERNAME``: an active login for a person, from the console.

The password comes from ``--password``, from the first line of standard input
(``--password-stdin``, kept out of the process list and the shell's history), or, without either,
is generated and printed once. It is checked by ``AUTH_PASSWORD_VALIDATORS`` as a person's own
would be. ``--staff`` lets the person into the admin (their permissions still decide what they
see there); an existing username is refused, never changed."""

import secrets
import sys

from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction


class Command(BaseCommand):
    help = ("Create an active user USERNAME; without --password or --password-stdin a random "
            "password is generated and printed once. Refuses an existing username.")
    stealth_options = ("stdin",)

    def add_arguments(self, parser):
        parser.add_argument("username")
        given = parser.add_mutually_exclusive_group()
        given.add_argument("--password", help="the password (visible in the process list: prefer --password-stdin)")
        given.add_argument("--password-stdin", action="store_true",
                           help="read the password from standard input's first line")
        parser.add_argument("--email", default="", help="their email address")
        parser.add_argument("--staff", action="store_true", help="may log in to the admin (/admin/)")

    def handle(self, *args, username, password, password_stdin, email, staff, **options):
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            raise CommandError(f"a user named {username!r} already exists; nothing changed")
        if password_stdin:
            password = (options.get("stdin") or sys.stdin).readline().rstrip("\r\n")
            if not password:
                raise CommandError("--password-stdin read an empty password")
        generated = password is None
        if generated:
            password = secrets.token_urlsafe(16)

        user = User(username=username, email=email, is_active=True, is_staff=staff)
        try:
            user.full_clean(exclude=["password"], validate_unique=False)
            if not generated:
                password_validation.validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        user.set_password(password)
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:  # made by someone else since the check above
            raise CommandError(f"a user named {username!r} already exists; nothing changed") from None

        self.stdout.write(f"created user {username}" + (" (staff)" if staff else "")
                          + (f" <{email}>" if email else ""))
        if generated:
            self.stdout.write(f"password: {password}  (shown once; not stored in clear)")

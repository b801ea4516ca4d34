"""``manage.py adduser`` makes an active login from the console, and never touches an existing one."""

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from collab.management.commands.adduser import Command as AddUser


def adduser(*args, stdin=None, **options):
    out = io.StringIO()
    if stdin is not None:
        options["stdin"] = io.StringIO(stdin)
    call_command("adduser", *args, stdout=out, **options)
    return out.getvalue()


def test_adduser_creates_an_active_user_with_the_given_password(db):
    out = adduser("alice", "--password", "correct-horse-battery", "--email", "alice@example.com")
    user = get_user_model().objects.get(username="alice")
    assert user.is_active and not user.is_staff and not user.is_superuser
    assert user.email == "alice@example.com"
    assert user.check_password("correct-horse-battery")
    assert "created user alice" in out and "correct-horse-battery" not in out


def test_adduser_reads_the_password_from_stdin(db):
    out = adduser("bob", "--password-stdin", stdin="from-the-pipe-123\n")
    assert get_user_model().objects.get(username="bob").check_password("from-the-pipe-123")
    assert "from-the-pipe-123" not in out


def test_adduser_without_a_password_generates_one_and_prints_it_once(db):
    out = adduser("carol")
    printed = re.findall(r"password: (\S+)", out)
    assert len(printed) == 1 and len(printed[0]) >= 16
    assert out.count(printed[0]) == 1
    assert get_user_model().objects.get(username="carol").check_password(printed[0])


def test_adduser_staff_may_enter_the_admin_but_is_no_superuser(db):
    out = adduser("dave", "--password", "pw-secret-123", "--staff")
    user = get_user_model().objects.get(username="dave")
    assert user.is_staff and not user.is_superuser
    assert "(staff)" in out


def test_adduser_refuses_an_existing_username_and_changes_nothing(db, make_user):
    existing = make_user("erin", password="the-old-password")
    with pytest.raises(CommandError, match="already exists"):
        adduser("erin", "--password", "a-new-password-1", "--staff")
    existing.refresh_from_db()
    assert existing.check_password("the-old-password") and not existing.is_staff
    assert get_user_model().objects.filter(username="erin").count() == 1


def test_adduser_refuses_a_weak_password_or_a_bad_username_or_email(db):
    with pytest.raises(CommandError, match="too short"):
        adduser("frank", "--password", "short")
    with pytest.raises(CommandError, match="username"):
        adduser("has space!", "--password", "pw-secret-123")
    with pytest.raises(CommandError, match="email"):
        adduser("grace", "--password", "pw-secret-123", "--email", "not-an-address")
    with pytest.raises(CommandError, match="empty"):
        adduser("heidi", "--password-stdin", stdin="\n")
    assert not get_user_model().objects.filter(username__in=["frank", "has space!", "grace", "heidi"]).exists()


def test_adduser_takes_one_way_of_giving_the_password(db):
    with pytest.raises(CommandError):
        adduser("ivan", "--password", "pw-secret-123", "--password-stdin", stdin="other-secret-1\n")


def test_adduser_exits_non_zero_for_an_existing_username(transactional_db, make_user, capsys):
    make_user("judy")
    with pytest.raises(SystemExit) as exit_:
        AddUser().run_from_argv(["manage.py", "adduser", "judy", "--password", "pw-secret-123"])
    assert exit_.value.code != 0
    assert "already exists" in capsys.readouterr().err

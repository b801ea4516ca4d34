"""Plan items (docs/contract.md#plans-and-jobs): recording them never starts anything."""

from django.db import transaction
from django.utils import timezone

from collab.errors import Invalid, NotFound
from collab.events import send_event_on_commit
from collab.models import Todo, TodoStatus
from collab.text import clean_text


def _check_blockers(session, ids) -> list[Todo]:
    ids = list(dict.fromkeys(ids or []))
    blockers = list(Todo.objects.filter(session=session, pk__in=ids))
    if len(blockers) != len(ids):
        missing = sorted(set(ids) - {t.pk for t in blockers})
        raise NotFound(f"no todo with id {', '.join(map(str, missing))} in this session", code="unknown_todo")
    return blockers


def do_create_todo(session, branch, *, subject: str, description: str = "", blocked_by=(), user=None) -> Todo:
    subject, description = clean_text((subject or "").strip()), clean_text(description or "")
    if not subject:
        raise Invalid("subject must not be empty", code="invalid_subject")
    with transaction.atomic():
        blockers = _check_blockers(session, blocked_by)
        todo = Todo.objects.create(session=session, branch=branch, subject=subject[:300], description=description or "")
        todo.blocked_by.set(blockers)
        send_event_on_commit(session.pk, "todo.created", {"todo": todo.pk, "subject": todo.subject}, actor=user)
    return todo


def do_update_todo(session, todo_id: int, *, status=None, subject=None, description=None, blocked_by=None, user=None) -> Todo:
    if status is not None and status not in TodoStatus.values:
        raise Invalid(f"status must be one of {', '.join(TodoStatus.values)}", code="invalid_status")
    with transaction.atomic():
        todo = Todo.objects.select_for_update().filter(session=session, pk=todo_id).first()
        if todo is None:
            raise NotFound(f"no todo with id {todo_id} in this session", code="unknown_todo")
        if status is not None:
            todo.status = status
        if subject is not None:
            if not subject.strip():
                raise Invalid("subject must not be empty", code="invalid_subject")
            todo.subject = clean_text(subject.strip())[:300]
        if description is not None:
            todo.description = clean_text(description)
        if blocked_by is not None:
            if todo.pk in blocked_by:
                raise Invalid("a todo cannot block itself", code="invalid_blocked_by")
            todo.blocked_by.set(_check_blockers(session, blocked_by))
        todo.updated_at = timezone.now()
        todo.save()
        send_event_on_commit(session.pk, "todo.updated", {"todo": todo.pk, "status": todo.status}, actor=user)
    return todo

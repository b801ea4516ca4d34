"""Row locks: taken before rows are read, in one order.

The order, everywhere:

    project → session(s) → branch(es) → job(s)

- **project**: only a worker's claim takes it (fair share, ``fair_share.lock_project_for_claim``), first.
- **sessions**: a root session before its child sessions, otherwise by id
  (``lock_sessions``). Every event row-locks its session (``Session.last_event_seq``),
  so a transaction that writes on a branch or job locks the sessions it will write
  events to *first*, not halfway through.
- **branches** after their sessions; **jobs** last, an ancestor (the calling job)
  before its descendants.
- **webhooks**: a completion takes ``FOR KEY SHARE`` on its project's active webhooks
  (``collab.services.webhooks.active_webhooks_key_shared``), which conflicts only with
  deleting one; a deletion locks the project, then the webhook, and nothing after it.

Each helper locks one row alone — ``SELECT … FOR NO KEY UPDATE`` with no join — and
returns it freshly read after the lock is held; whatever hangs off it (a branch's
tip, a job's session) is loaded afterwards by a separate query. A join in the
locking statement would hand back, on PostgreSQL, the *old* joined row when the
statement had to wait for the lock (the READ COMMITTED re-check reads only the
locked row again). ``NO KEY`` so that inserting rows that point at the locked row
(messages, events, jobs) is not blocked by it.

A transaction that can still deadlock (two sessions met in opposite order) is run
whole again by ``collab.services.retry.retry_on_deadlock``; the functions it wraps
reload every row they hold in memory at the start of each attempt.

On SQLite there are no row locks: a write transaction holds the database, and these
helpers only read the rows.
"""

from contextlib import contextmanager

from collab.errors import NotFound
from collab.models import Branch, Job, Session
from collab.infra import prepared
from collab.infra.prepared import Param, Select


# each lock below is one statement compiled once per process (collab.infra.prepared): the
# claim and the completion take them at every turn
_LOCK_SESSION = Select("lock_session", lambda: Session.objects.select_for_update(no_key=True)
                       .filter(pk=Param("id", Session._meta.pk)).order_by())
_LOCK_BRANCH = Select("lock_branch", lambda: Branch.objects.select_for_update(no_key=True)
                      .filter(pk=Param("id", Branch._meta.pk)).order_by())


def lock_sessions(*session_ids) -> dict:
    """Lock these sessions (None and repeats ignored) in the one order; returns {id: Session}
    (a session that does not exist is left out)."""
    ids = {sid for sid in session_ids if sid}
    if not ids:
        return {}
    if len(ids) == 1:  # nothing to order: no query for the parents
        (sid,) = ids
        row = _LOCK_SESSION.first(id=sid)
        return {} if row is None else {sid: row}
    parents = dict(Session.objects.filter(pk__in=ids).values_list("pk", "parent_session_id"))
    ordered = sorted(parents, key=lambda sid: (parents[sid] is not None, sid))
    locked = {sid: _LOCK_SESSION.first(id=sid) for sid in ordered}
    return {sid: row for sid, row in locked.items() if row is not None}


def lock_session(session_id) -> Session:
    """The session, locked; ``NotFound`` when it is gone (deleted while this request waited
    for its lock: ``services.sessions.do_delete_session``).
    Precondition: inside ``transaction.atomic``; no branch or job of another session locked yet."""
    row = _LOCK_SESSION.first(id=session_id)
    if row is None:
        raise NotFound()
    return row


def lock_branch(branch_id) -> Branch:
    """The branch, locked, read after the lock (its ``tip`` loads lazily, after it too).
    Precondition: its session is locked already when this transaction writes events there."""
    return _LOCK_BRANCH.get(id=branch_id)


def lock_branch_if_any(branch_id) -> Branch | None:
    """``lock_branch``, or None when the branch is gone (its session was deleted meanwhile)."""
    return _LOCK_BRANCH.first(id=branch_id)


def lock_job(job_id, *, status_in=None) -> Job | None:
    """The job, locked and read after the lock; None if it is gone (or not in ``status_in``)."""
    rows = Job.objects.select_for_update(no_key=True).filter(pk=job_id)
    if status_in is not None:
        rows = rows.filter(status__in=status_in)
    return rows.first()


def lock_for_branch(branch_id, *more_session_ids) -> Branch:
    """The usual prefix of a write on a branch: its session (and ``more_session_ids``, e.g. a
    sender's, whose log will get an event too), then the branch."""
    session_id = Branch.objects.filter(pk=branch_id).values_list("session_id", flat=True).first()
    if session_id is None:
        raise Branch.DoesNotExist(branch_id)
    lock_sessions(session_id, *more_session_ids)
    return lock_branch(branch_id)


def lock_session_family(session_id, *more_session_ids) -> Session:
    """Lock a job's session and, for an OpenWork child, its root session too (a job's state
    changes are written to both logs: ``child.job``), plus ``more_session_ids``; returns the
    job's session."""
    parent_id = Session.objects.filter(pk=session_id).values_list("parent_session_id", flat=True).first()
    return lock_sessions(session_id, parent_id, *more_session_ids)[session_id]


@contextmanager
def kept_on_rollback(branch: Branch):
    """Undo, on an exception, what ``append_message`` moved on the in-memory ``branch`` (its
    tip and counters): the transaction rolls back, so a retry — or the turn's next write —
    must not hang a node off a tip that was never committed."""
    saved = (branch.tip_id, branch._state.fields_cache.get("tip"), branch.chars, branch.last_active_at)
    try:
        yield branch
    except BaseException:
        branch.tip_id, tip, branch.chars, branch.last_active_at = saved
        if tip is not None:
            branch.tip = tip
        else:
            branch._state.fields_cache.pop("tip", None)
        raise


def update_returning(queryset, *, returning=None, **values):
    """``queryset.update(**values)`` that also hands back the rows it changed, as they are after
    it, read by the UPDATE itself (``UPDATE … RETURNING``): the row lock the UPDATE takes is held
    as they are read, and no second statement reads them again. A conditional UPDATE that
    matched nothing returns []. Rows are converted as a SELECT of the model would convert them.
    ``returning``: {name: expression} evaluated by the same statement on each changed row (after
    the change), set on the instances as attributes (booleans: EXISTS …). The same statement,
    compiled once per shape: ``collab.infra.prepared.Update``."""
    return prepared.update_returning(queryset, values, returning or {})


def refresh_from_row(instance, row) -> None:
    """What ``instance.refresh_from_db()`` does, from a row already read (``update_returning``):
    every field takes the row's value, and cached related rows are dropped (they load again
    when read)."""
    for field in instance._meta.concrete_fields:
        setattr(instance, field.attname, getattr(row, field.attname))
        if field.is_relation and field.is_cached(instance):
            field.delete_cached_value(instance)
    for field in instance._meta.related_objects:
        if field.is_cached(instance):
            field.delete_cached_value(instance)
    instance._state.db = row._state.db

"""The one place collab rows are fetched and authorized (docs/contract.md#authorization-and-visibility).

Every entry point — pages, API, WebSocket, tools, the tool gateway, admin actions — goes
through these helpers: ``access_…`` fetches a row the principal may use (``access_branch`` turns
any reference — ``SID:HEAD``, a name, a page's branch id — into an authorized branch),
``require_…`` refuses an action (``NotFound`` / ``Forbidden``) and ``can_…`` answers the same
question for a page that offers a control exactly when its action would be allowed. Every rule
lives here, row rules included (own branches, own executions, holds, job ownership, acting as a
branch, changing a session's visibility); ``accounts.policy`` maps roles to capabilities.

The membership check runs *before* the target row is loaded where the id alone allows it, and
outsiders always get the same ``NotFound`` as for a missing id, so neither answers nor work
done leak existence.

Row-level visibility (docs/contract.md#visibility) lives here too: ``visible_sessions(user)`` is the ONE
queryset of sessions a person (and every agent acting for them) may see, and every listing
filters through it; a lookup of one session or execution by id reads the person's standing in
it with the row and decides with ``session_role``'s rule, the same rule in Python
(``_effective_role``; tests/collab/test_visibility* hold the two to the same answers). Either
way a private or shared session one may not see answers exactly like a missing id. A child
session follows its root session's visibility.
"""

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from accounts.models import ApiToken, Project
from accounts.policy import (
    has_capability,
    lesser_role,
    member_project_ids,
    own_tokens,
    project_ids_with,
    role_allows,
    role_of,
    roles_of_user_id,
)
from collab.errors import DomainError, Forbidden, Invalid, NotFound
from collab.infra.prepared import Param, Select
from collab.models import (
    Artifact,
    Branch,
    HeldDelivery,
    Job,
    Message,
    PersonAsk,
    Session,
    SessionShare,
    Visibility,
    Webhook,
)


def _open_to(user, root: str) -> Q:
    """The root session (reached through ``root``) shows itself to ``user`` as a non-maintainer."""
    shared_with = SessionShare.objects.filter(user=user).values("session_id")
    return (
        Q(**{f"{root}visibility": Visibility.PROJECT})
        | Q(**{f"{root}created_by": user.pk})
        | Q(**{f"{root}visibility": Visibility.SHARED, f"{root}pk__in": shared_with})
    )


def visible_sessions(user):
    """Every session ``user`` may see, as one queryset (no per-row checks): sessions of their
    accepted projects whose root is ``project``-wide, theirs, shared with them — or any, where
    they are a maintainer or owner. Listings filter with it; ``visible_session_ids`` for rows
    hanging off sessions."""
    if not user or not user.is_authenticated:
        return Session.objects.none()
    return Session.objects.filter(project_id__in=member_project_ids(user)).filter(
        Q(project_id__in=project_ids_with(user, "session.see_all"))
        | (Q(parent_session__isnull=True) & _open_to(user, ""))
        | (Q(parent_session__isnull=False) & _open_to(user, "parent_session__"))
    )


def visible_session_ids(user):
    """``visible_sessions`` as a subquery of ids: ``rows.filter(session_id__in=visible_session_ids(user))``."""
    return visible_sessions(user).values("pk")


def session_role(user, session: Session) -> str | None:
    """The user's effective role in ``session``: their project role, narrowed to their share's
    role in a ``shared`` session (the lesser of the two); None when they may not see it."""
    return _effective_role(user, session, role_of(user, session.project_id), _share_of)


def _share_of(user, root: Session) -> str | None:
    return SessionShare.objects.filter(session_id=root.pk, user=user).values_list("role", flat=True).first()


def _effective_role(user, session: Session, role: str | None, share_of) -> str | None:
    """``session_role`` from the user's project ``role`` (None: not an accepted member);
    ``share_of(user, root)`` gives their share's role in the root session (asked only for a
    ``shared`` root they did not create, and where their role does not see every session)."""
    if role is None or role_allows(role, "session.see_all"):
        return role
    root = session.parent_session if session.parent_session_id else session
    if root.visibility == Visibility.PROJECT or root.created_by_id == user.pk:
        return role
    if root.visibility == Visibility.SHARED:
        shared = share_of(user, root)
        if shared:
            return lesser_role(role, shared)
    return None


def _with_viewer_role(rows, user_id, to_session: str = ""):
    """``rows`` (sessions, or rows reaching one through ``to_session``, e.g. ``"session__"``)
    with what ``_effective_role`` needs of the user ``user_id`` (active and signed in; a value or
    a ``Param``) read in the same statement: their accepted role in the session's project
    (``viewer_role``) and their share of its root session (``viewer_share``). An outsider's lookup
    then costs what a missing id's does: one statement."""
    return rows.annotate(
        viewer_role=Subquery(roles_of_user_id(user_id).filter(project_id=OuterRef(f"{to_session}project_id"))
                             .values("role")[:1]),
        viewer_share=Subquery(SessionShare.objects.filter(
            user_id=user_id,
            session_id=Coalesce(OuterRef(f"{to_session}parent_session_id"), OuterRef(f"{to_session}pk")),
        ).values("role")[:1]),
    )


def _role_read_with(user, session: Session, row) -> str | None:
    """``session_role`` from what ``_with_viewer_role`` read with ``row`` (no query)."""
    return _effective_role(user, session, row.viewer_role, lambda _user, _root: row.viewer_share)


def _checked(role: str | None, capability: str) -> str:
    """NotFound when there is no role (outsiders look like a missing id), Forbidden when too low."""
    if role is None:
        raise NotFound()
    if not role_allows(role, capability):
        raise Forbidden(f"your role ({role}) does not allow {capability}")
    return role


def require_role(role: str | None, capability: str) -> str:
    """``require_in_session`` for a role read already (``require_standing``'s, this call's)."""
    return _checked(role, capability)


def require_in_session(user, session: Session, capability: str) -> str:
    """The user's effective role in the session; NotFound if they may not see it, Forbidden if too low."""
    return _checked(session_role(user, session), capability)


def can_in_session(user, session: Session, capability: str) -> bool:
    return role_allows(session_role(user, session), capability)


def require_in_project(user, project_id: int, capability: str) -> str:
    """The user's role in the project; NotFound for outsiders, Forbidden for too-low roles."""
    return _checked(role_of(user, project_id), capability)


def access_project(user, slug: str, capability: str = "project.read") -> Project:
    project = Project.objects.filter(slug=slug, pk__in=member_project_ids(user)).first() if user.is_authenticated else None
    if project is None:
        raise NotFound()
    require_in_project(user, project.pk, capability)
    return project


def _by_id(rows, to_session: str, within_project: bool):
    """A lookup of one row of ``rows`` by id (``Param("id")``) with the standing of the user
    ``Param("user")`` in its session, and (``within_project``) only in ``Param("project")``:
    agents stay in their project, so an agent-side lookup passes the acting branch's
    project, and a row of any other project answers like a missing one. The statement of
    ``access_session`` and ``access_job``, compiled once per process and shape
    (``collab.infra.prepared``): every API request on a session or execution makes one."""
    # the id typed as the primary key (a value not a string is made one, as the ORM would)
    rows = _with_viewer_role(rows, Param("user"), to_session).filter(pk=Param("id", rows.model._meta.pk))
    if within_project:
        rows = rows.filter(project_id=Param("project"))
    return rows[:1]


_SESSION = Select("access_session", lambda within_project: _by_id(
    Session.objects.select_related("project", "agent_spec", "parent_session"), "", within_project))
_JOB = Select("access_job", lambda within_project: _by_id(
    Job.objects.select_related("session", "session__parent_session", "branch").with_result(), "session__",
    within_project))


def access_session(user, session_id: str, capability: str = "project.read", *, project_id: int | None = None) -> Session:
    """The session if the user may do ``capability`` in its project (and it is in ``project_id``,
    when an agent asks).

    One statement reads the session and the user's standing in it (``_with_viewer_role``), and
    ``session_role``'s rule decides — so an outsider's request costs exactly what a request for
    a missing id costs, and both answer ``NotFound``.
    """
    session, role = _session_and_role(user, session_id, project_id)
    _checked(role, capability)
    return session


def as_now(user):
    """The person as the database has them now, or None when deactivated or deleted: a
    long-lived connection re-checks its access with this (its user was read when it opened)."""
    pk = getattr(user, "pk", None)
    return None if pk is None else get_user_model().objects.filter(pk=pk, is_active=True).first()


def _session_and_role(user, session_id: str, project_id: int | None = None) -> tuple[Session | None, str | None]:
    """The session and the user's effective role in it, read in one statement; (None, None) when
    it does not exist (or is not in ``project_id``) or the user is not an active signed-in one."""
    if not user or not user.is_authenticated or not user.is_active:
        return None, None
    session = _SESSION.first(project_id is not None, id=session_id, user=user.pk, project=project_id)
    return session, (None if session is None else _role_read_with(user, session, session))


def access_job(user, job_id: str, capability: str = "project.read", *, project_id: int | None = None) -> Job:
    if not user or not user.is_authenticated or not user.is_active:
        raise NotFound()
    job = _JOB.first(project_id is not None, id=job_id, user=user.pk, project=project_id)
    _checked(None if job is None else _role_read_with(user, job.session, job), capability)
    return job


def still_reads_job(viewer, token_id: int | None, job_id: str) -> bool:
    """Whether a long-lived stream of the job (its SSE, a LangGraph run's stream) may go on:
    its viewer, as the database has them now, may still see the job, and the token they came
    with (``token_id``; None: a browser session) is still usable."""
    if token_id is not None and not ApiToken.objects.active().filter(pk=token_id).exists():
        return False
    viewer = as_now(viewer)
    if viewer is None:  # deactivated or deleted since the stream opened
        return False
    try:
        access_job(viewer, job_id)
    except DomainError:
        return False
    return True


def access_message(user, session_id: str, message_id: str, capability: str = "project.read", *,
                   project_id: int | None = None) -> Message:
    session = access_session(user, session_id, capability, project_id=project_id)
    message = Message.objects.filter(pk=message_id, session=session).select_related("branch").first()
    if message is None:
        raise NotFound()
    return message


def require_can_set_internal(user, branch: Branch) -> str:
    """Who may mark a branch internal or not: maintainers and owners, by their
    effective role in its session (``branch.internal``). One who may not see the session gets the
    ``NotFound`` of a missing id; a member or viewer gets ``Forbidden``."""
    return require_in_session(user, branch.session, "branch.internal")


def require_can_cancel(user, job: Job) -> str:
    """Who may cancel an execution (docs/contract.md#cancel): by the effective role in its session —
    a maintainer any execution (``runtime.control``), a member the ones they started
    (``execution.cancel_own``). One who may not see the session gets the ``NotFound`` of a
    missing id; a share narrower than the project role (a viewer's) gets ``Forbidden``."""
    role = session_role(user, job.session)
    if role is None:
        raise NotFound()
    if role_allows(role, "runtime.control"):
        return role
    if role_allows(role, "execution.cancel_own") and job.started_by_id == getattr(user, "pk", None):
        return role
    raise Forbidden(f"your role in this session ({role}) may only cancel executions you started"
                    if role_allows(role, "execution.cancel_own") else f"your role in this session ({role}) may not cancel executions")


def can_cancel(user, job: Job) -> bool:
    """``require_can_cancel`` as a yes/no, for a page offering the cancel button."""
    return _allowed(require_can_cancel, user, job)


def owns_branch(user, branch: Branch) -> bool:
    """A branch is the person's own when they started it: the root branch of a session they
    created, or a branch made by a job they started (``Branch.created_by`` records both)."""
    return branch.created_by_id is not None and branch.created_by_id == getattr(user, "pk", None)


def require_can_archive(user, branch: Branch) -> str:
    """Members archive branches they started, maintainers any (docs/contract.md#archive) — by their
    effective role in the branch's session."""
    return require_in_session(user, branch.session, "branch.archive_own" if owns_branch(user, branch) else "branch.archive_any")


def can_archive(user, branch: Branch) -> bool:
    """``require_can_archive`` as a yes/no, for a page offering the archive form."""
    return _allowed(require_can_archive, user, branch)


def require_can_act_as(user, branch: Branch) -> str:
    """Who may act as a branch from outside a turn (the tool gateway): members as
    branches they started, maintainers and owners as any; viewers never."""
    role = require_in_session(user, branch.session, "turn.start")
    if not owns_branch(user, branch):
        require_in_session(user, branch.session, "branch.act_any")
    return role


def require_standing(user, session_id: str) -> str:
    """An agent's principal must still see the session it acts in (its visibility may change
    under a running turn): "not found" otherwise, as for any other. The session row
    is read afresh, with the principal's standing in it, in one statement (``access_session``'s):
    the turn's copy may predate the change. Returns their effective role there."""
    return _checked(_session_and_role(user, session_id)[1], "project.read")


def can_change_visibility(user, session: Session) -> bool:
    """Who changes who sees a session: its creator (while they still see it) or a
    maintainer/owner of its project."""
    role = session_role(user, session)
    if role is None:
        return False
    return role_allows(role, "session.see_all") or (session.created_by_id is not None
                                                     and session.created_by_id == user.pk)


def require_can_change_visibility(user, session: Session) -> None:
    if not can_change_visibility(user, session):
        raise Forbidden("only the session's creator or a maintainer changes who sees it")


def require_can_delete_session(user, session: Session) -> str:
    """Who deletes a session (a LangGraph thread's ``DELETE``, docs/langgraph.md#threads): one
    whose role there may start turns and who may change who sees it — its creator, a maintainer
    or an owner. One who may not see it gets the ``NotFound`` of a missing id."""
    role = require_in_session(user, session, "turn.start")
    if not can_change_visibility(user, session):
        raise Forbidden("only the session's creator or a maintainer deletes it")
    return role


# --- held deliveries (the watch policy, docs/contract.md#watch-policy) ----------------------------

DECIDE_HOLDS = "turn.start"  # who may approve or reject a held delivery: who may post in its sender session


def can_decide_holds(user, session: Session) -> bool:
    """Whether ``user`` may approve or reject the deliveries held from ``session`` (the page
    offers the buttons exactly then; ``access_hold`` refuses everyone else)."""
    return can_in_session(user, session, DECIDE_HOLDS)


def access_hold(user, hold_id: int, capability: str = DECIDE_HOLDS, *, session_id: str | None = None) -> HeldDelivery:
    """A held delivery the user may decide: by their role in its sender session. ``session_id``:
    a page's URL names the session too, and a hold of another session is "not found"."""
    if not user or not user.is_authenticated:
        raise NotFound()
    hold = HeldDelivery.objects.filter(pk=hold_id, project_id__in=member_project_ids(user)).select_related(
        "sender_session", "sender_branch", "target_branch", "sender_job", "created_by").first()
    if hold is None or (session_id is not None and hold.sender_session_id != session_id):
        raise NotFound()
    access_session(user, hold.sender_session_id, capability)
    return hold


# --- asks: what waits for a person (docs/contract.md#people-in-the-loop) -------------------------

DECIDE_ASKS = DECIDE_HOLDS  # who may decide an ask: who may post in its session (and its addressee only, when it names one)


def decidable_asks(user):
    """The asks ``user`` may decide, in one queryset (the inbox): in sessions they may see, of
    projects where their role may post, addressed to nobody or to them. ``access_ask`` decides
    each with the person's standing in its session."""
    if not user or not user.is_authenticated or not user.is_active:
        return PersonAsk.objects.none()
    return PersonAsk.objects.filter(
        Q(to_user__isnull=True) | Q(to_user=user),
        project_id__in=project_ids_with(user, DECIDE_ASKS), session_id__in=visible_session_ids(user))


def access_ask(user, ask_id: str, capability: str = DECIDE_ASKS) -> PersonAsk:
    """An ask the user may decide (``decidable_asks``' rule, with their role in its session);
    anyone else gets the same ``NotFound`` as for a missing id."""
    if not user or not user.is_authenticated or not isinstance(ask_id, str):
        raise NotFound()
    ask = (PersonAsk.objects.filter(pk=ask_id, project_id__in=member_project_ids(user))
           .select_related("session", "branch", "job", "to_user").first())
    if ask is None or (ask.to_user_id is not None and ask.to_user_id != user.pk):
        raise NotFound()
    access_session(user, ask.session_id, capability)
    return ask


def may_be_asked(user, session: Session) -> bool:
    """Whether ``ask_person(to=user)`` may name ``user`` in ``session``: an active person who may
    see the session and decide there."""
    return bool(user and user.is_active and can_in_session(user, session, DECIDE_ASKS))


# --- job ownership (docs/contract.md#plans-and-jobs) ---------------------------------------------

MAX_ANCESTRY = 64


def session_owns_job(session_id: str, job: Job) -> bool:
    """Whether ``session_id`` may read ``job``'s result: it executes it, dispatched it, or
    dispatched an ancestor job (at most 64 levels up, cycle-safe)."""
    seen: set[str] = set()
    current = job
    for _ in range(MAX_ANCESTRY + 1):
        if current is None or current.pk in seen:
            return False
        if session_id in (current.session_id, current.caller_session_id):
            return True
        seen.add(current.pk)
        if not current.parent_job_id:
            return False
        current = Job.objects.filter(pk=current.parent_job_id).only("pk", "session_id", "caller_session_id", "parent_job_id").first()
    return False


def access_owned_job(user, job_id: str, session: Session) -> Job:
    """A job an agent acting in ``session`` may read the output of (``job_output``): one its
    principal may read, in its project, that the session executes or (an ancestor) dispatched;
    any other answers like a missing id."""
    job = access_job(user, job_id, project_id=session.project_id)
    if not session_owns_job(session.pk, job):
        raise NotFound()
    return job


def can(user, project_id: int, capability: str) -> bool:
    return has_capability(user, project_id, capability)


def _allowed(rule, *args) -> bool:
    try:
        rule(*args)
    except (Forbidden, NotFound):
        return False
    return True


def access_artifact(user, artifact_id: str):
    """An artifact is readable exactly by those who may read its execution."""
    if not user or not user.is_authenticated:
        raise NotFound()
    artifact = Artifact.objects.filter(pk=artifact_id, project_id__in=member_project_ids(user),
                                       session_id__in=visible_session_ids(user)).first()
    if artifact is None:
        raise NotFound()
    access_job(user, artifact.job_id)
    return artifact


# --- branch references: the one resolver (docs/contract.md#addresses) ----------------------------
#
# An address is ``"SID:HEAD"`` (any message written on the branch; a stale head still finds its
# branch) or a branch name. Names resolve in the caller's session first, then across the other
# sessions of the caller's project. A target that does not exist answers exactly like one the
# principal may not see.
#
# Agents stay in their project: an agent's ``Caller`` carries the acting branch's
# project, and nothing outside it is ever found, whatever else the person who started the turn
# may see. A person (the REST routes, the pages) has no project and may address any project they
# have accepted.
#
# Internal branches are hidden from agents: an agent's ``Caller`` (one with a
# ``branch_id``) never finds an internal branch by NAME — it answers like a missing name. Its
# explicit ``SID:HEAD`` address still resolves for whoever may see the session, and people (the
# REST routes, a user turn) still find it by name.
#
# Row-level visibility: every lookup is limited to ``visible_sessions`` of the
# principal (an agent acts with the permissions of the person who started its root turn).


class Ambiguous(Invalid):
    code = "ambiguous_target"


@dataclass(frozen=True)
class Caller:
    """Who is addressing: the principal (a user) and, for agents, where they stand.
    ``project_id`` confines every lookup to that project (agents always set it)."""

    user: object
    session_id: str | None = None
    branch_id: str | None = None
    project_id: int | None = None

    def confine(self, rows, session_field: str, project_field: str):
        """``rows`` limited to the sessions the principal may see and, for an agent, its project."""
        rows = rows.filter(**{f"{session_field}__in": visible_session_ids(self.user)})
        if self.project_id is not None:
            rows = rows.filter(**{project_field: self.project_id})
        return rows

    @property
    def is_agent(self) -> bool:
        """An agent addresses (it stands on a branch); a person does not."""
        return self.branch_id is not None


def parse_address(address: str) -> tuple[str, str] | None:
    """``(session_id, message_id)`` for a ``SID:HEAD`` address, None for a name."""
    sid, sep, head = address.partition(":")
    if sep and sid and head:
        return sid, head
    return None


def find_branch(caller: Caller, address: str) -> Branch:
    """The branch an address names, archived or not, among those the caller may see; no
    capability is checked (``access_branch`` does)."""
    address = (address or "").strip()
    if not address:
        raise Invalid("an address is required: 'SID:HEAD' or a branch name", code="invalid_address")
    if not caller.user or not caller.user.is_authenticated:
        raise NotFound()
    parsed = parse_address(address)
    if parsed is not None:
        sid, head = parsed
        message = (
            caller.confine(Message.objects.filter(pk=head, session_id=sid), "session_id", "session__project_id")
            .select_related("branch", "branch__session", "branch__tip")
            .first()
        )
        if message is None:
            raise NotFound(f"no agent at {address}")
        return message.branch
    return _find_by_name(caller, address)


def _find_by_name(caller: Caller, name: str) -> Branch:
    """The caller's own session answers first: its live branch of that name, else its archived
    one (reported as archived by deliveries, never silently replaced by another session's
    branch). Only when the caller's session has none does the rest of the project answer,
    live branches before archived ones (so an archived branch stays readable by name)."""
    visible = caller.confine(Branch.objects.filter(name=name), "session_id", "session__project_id").select_related("session", "tip")
    if caller.is_agent:  # internal branches are hidden from agents by name
        visible = visible.filter(internal=False)
    pools = []
    if caller.session_id:
        own = visible.filter(session_id=caller.session_id)
        pools += [own.filter(archived=False), own.filter(archived=True)]
        visible = visible.exclude(session_id=caller.session_id)
    pools += [visible.filter(archived=False).order_by("-last_active_at"),
              visible.filter(archived=True).order_by("-last_active_at")]
    candidates = []
    for pool in pools:
        candidates = list(pool[:11])
        if candidates:
            break
    if not candidates:
        raise NotFound(f"no agent named {name!r}")
    if len(candidates) > 1:
        listed = ", ".join(f"{b.address or b.session_id + ':(empty)'}" for b in candidates[:10])
        raise Ambiguous(
            f"{len(candidates) if len(candidates) <= 10 else 'more than 10'} agents are named {name!r}: {listed}; "
            "address one as SID:HEAD",
            candidates=[b.address for b in candidates[:10]],
        )
    return candidates[0]


def access_branch(user, reference: str, capability: str = "project.read", *, caller: Caller | None = None,
                  session_id: str | None = None) -> Branch:
    """The branch ``reference`` names, if ``user`` may do ``capability`` by their effective role
    in its session — the one way every entry point (API, pages, tools, the tool gateway, user
    turns) turns a reference into an authorized branch.

    ``reference`` is ``"SID:HEAD"`` or a branch name, resolved as ``caller`` (an agent's: confined
    to its project, its own session first, blind to internal names; default: ``user`` as a
    person) — or, with ``session_id`` (a page's URL ``/s/SID/b/BRANCH_ID``), a branch id in that
    session. A reference the user may not see answers exactly like a missing one (404); a role
    too low for ``capability`` is ``Forbidden``."""
    if not user or not user.is_authenticated:
        raise NotFound()
    if session_id is not None:
        branch = (
            Branch.objects.select_related("session", "session__project", "session__parent_session", "tip")
            .filter(pk=reference, session_id=session_id, session_id__in=visible_session_ids(user))
            .first()
        )
        if branch is None:
            raise NotFound()
    else:
        if caller is None:
            caller = Caller(user=user)
        elif caller.user is not user:
            raise ValueError("access_branch: the caller must act for the same user")
        branch = find_branch(caller, reference)
    require_in_session(user, branch.session, capability)
    return branch


def access_token(user, token_id: int):
    """One of ``user``'s own API tokens (``accounts.policy.own_tokens``); anyone else's, or
    none, is "not found" — the pages and the API ask this same rule."""
    token = own_tokens(user).select_related("user").filter(pk=token_id).first()
    if token is None:
        raise NotFound()
    return token


def access_webhook(user, webhook_id: str, capability: str = "project.webhooks", *,
                   project_id: int | None = None) -> Webhook:
    """A project webhook, for maintainers and owners of its project: its URL
    may itself be a credential (a chat service's incoming-webhook URL), so members and viewers
    get ``Forbidden`` even to read it; anyone outside the project the ``NotFound`` of a missing
    id. The membership check is part of the lookup. ``project_id``: a page's URL names the
    project too, and a webhook of another project is "not found"."""
    if not user or not user.is_authenticated:
        raise NotFound()
    webhook = (Webhook.objects.select_related("project")
               .filter(pk=webhook_id, project_id__in=member_project_ids(user)).first())
    if webhook is None or (project_id is not None and webhook.project_id != project_id):
        raise NotFound()
    require_in_project(user, webhook.project_id, capability)
    return webhook

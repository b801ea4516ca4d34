from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from collab.models.ids import id_field

# The OpenWork task_name format for the database CHECKs: ``\A``/``\Z`` anchor at the very start and end
# on both PostgreSQL (ARE) and SQLite (Python ``re``), where ``$`` would accept a trailing newline
TASK_NAME_DB = r"\A[a-z][a-z0-9_]{0,47}\Z"


class Visibility(models.TextChoices):
    """Who sees a session (docs/contract.md#visibility). A child session follows its root's."""

    PROJECT = "project"  # every member of the project, by role (the default)
    PRIVATE = "private"  # its creator, plus maintainers and owners
    SHARED = "shared"  # its creator and the members named in ``SessionShare``, plus maintainers and owners


class Session(models.Model):
    """A conversation DAG in one project.

    ``head`` is the message a person has selected; agents never move it.
    ``last_event_seq`` is the per-session event counter: bumping it row-locks the
    session, so events of one session commit in ``seq`` order.
    """

    id = id_field()
    # no index of its own: session_project_recent leads with it
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="sessions", db_index=False)
    title = models.CharField(max_length=200, blank=True, default="")
    agent_spec = models.ForeignKey("collab.AgentSpec", null=True, blank=True, on_delete=models.SET_NULL)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    head = models.ForeignKey("collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    parent_session = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="child_sessions"
    )
    agent_role = models.CharField(
        max_length=16, null=True, blank=True,
        help_text="for an OpenWork child session: its role (explorer); null for a root session",
    )
    task_name = models.CharField(
        max_length=48, null=True, blank=True,
        help_text="for an OpenWork child session: its task_name, unique among the children of its root session",
    )
    visibility = models.CharField(
        max_length=16, choices=Visibility.choices, default=Visibility.PROJECT,
        help_text="who sees it (a child session follows its root's): project, private or shared",
    )
    last_event_seq = models.PositiveBigIntegerField(default=0)
    metadata = models.JSONField(
        default=dict, blank=True,
        help_text="a client's own key-value data (a LangGraph thread's metadata: docs/langgraph.md)",
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-last_active_at"]
        indexes = [models.Index(fields=["project", "-last_active_at"], name="session_project_recent")]
        constraints = [
            # a root has neither; a child session has both (its task_name is on its branch)
            models.CheckConstraint(
                condition=Q(parent_session__isnull=True, agent_role__isnull=True)
                | Q(parent_session__isnull=False, agent_role__isnull=False),
                name="session_child_fields_consistent",
            ),
            models.CheckConstraint(condition=~Q(parent_session=models.F("id")), name="session_parent_not_self"),
            models.CheckConstraint(condition=Q(visibility__in=Visibility.values), name="session_visibility_valid"),
            # uq_sessions_parent_task_name: a task_name names one child of one root session
            models.UniqueConstraint(
                fields=["parent_session", "task_name"], condition=Q(task_name__isnull=False),
                name="session_task_name_unique_per_root",
            ),
            models.CheckConstraint(
                condition=Q(task_name__isnull=True) | Q(parent_session__isnull=False, task_name__regex=TASK_NAME_DB),
                name="session_task_name_format",
            ),
        ]

    @property
    def is_child(self) -> bool:
        return self.parent_session_id is not None

    @property
    def root_id(self) -> str:
        """The session whose visibility and share list decide who sees this one."""
        return self.parent_session_id or self.pk

    def __str__(self):
        return f"{self.id} {self.title}"


class MessageRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class MessageKind(models.TextChoices):
    NORMAL = "normal"
    AGENT_SPAWN = "agent_spawn"
    AGENT_MESSAGE = "agent_message"
    TASK = "task"
    MESSAGE = "message"
    FOLLOWUP = "followup"
    NOTICE = "notice"
    ATTACH = "attach"


class Message(models.Model):
    """An immutable DAG node. It belongs to the branch it was written on.

    ``depth`` (distance from the root) and ``turn`` (turn ordinal along the
    lineage) let history windows be computed without walking the whole chain; ``dedupe_key`` makes at-most-once writes (mailbox
    drains, follow-ups) a database guarantee.
    """

    id = id_field()
    # session and branch: no index of their own, message_session_keyset and message_branch_depth lead with them
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages", db_index=False)
    predecessor = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="successors"
    )
    branch = models.ForeignKey("collab.Branch", on_delete=models.CASCADE, related_name="messages", db_index=False)
    job = models.ForeignKey("collab.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    kind = models.CharField(max_length=16, choices=MessageKind.choices, default=MessageKind.NORMAL)
    text = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    depth = models.PositiveIntegerField(default=0)
    turn = models.PositiveIntegerField(default=0, help_text="ordinal of the turn this node belongs to along its lineage")
    dedupe_key = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["depth", "created_at"]
        indexes = [
            models.Index(fields=["branch", "depth"], name="message_branch_depth"),
            # the session DAG's keyset pages: (created_at, id) in one index, newest first;
            # read backwards it serves every (session, created_at) order and range too
            models.Index(fields=["session", "-created_at", "-id"], name="message_session_keyset"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(role__in=MessageRole.values), name="message_role_valid"),
            models.CheckConstraint(condition=Q(kind__in=MessageKind.values), name="message_kind_valid"),
            models.CheckConstraint(
                condition=Q(predecessor__isnull=True, depth=0) | Q(predecessor__isnull=False, depth__gt=0),
                name="message_depth_consistent",
            ),
            models.UniqueConstraint(
                fields=["session", "dedupe_key"],
                condition=Q(dedupe_key__isnull=False),
                name="message_dedupe_key_unique",
            ),
        ]

    def __str__(self):
        return f"{self.session_id}:{self.id} {self.role}"

    @property
    def address(self) -> str:
        return f"{self.session_id}:{self.id}"


SHARE_ROLES = ("viewer", "member", "maintainer", "owner")


class SessionShare(models.Model):
    """A member a ``shared`` session is shown to, with the most they may do in it: their
    effective role is the lesser of ``role`` and their project role. Rows outlive a change
    of visibility (nothing is deleted); they count only while the session is ``shared``."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="shares")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="session_shares")
    role = models.CharField(max_length=16, default="viewer")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "user"], name="session_share_unique"),
            models.CheckConstraint(condition=Q(role__in=SHARE_ROLES), name="session_share_role_valid"),
        ]

    def __str__(self):
        return f"{self.session_id} → {self.user_id} ({self.role})"

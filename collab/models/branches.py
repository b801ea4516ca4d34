from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from collab.models.ids import id_field
from collab.models.sessions import TASK_NAME_DB

# How a text (a delivery header, a result notice) names a sender that has no address yet.
NO_ADDRESS = "an agent with no messages yet"


def format_address(session_id: str, head_id: str | None) -> str | None:
    """The one way a branch address is written (docs/contract.md#addresses): ``"SID:HEAD"``, HEAD a message of that
    branch. Without a message there is no address: None (as the API's ``head: MSG|null``), never a
    bare ``SID`` or ``SID:None``, which no resolver accepts."""
    return f"{session_id}:{head_id}" if head_id else None


def effective_spec(branch, session=None):
    """The AgentSpec a branch runs with: the branch's own, else its session's default.
    ``session`` saves a query when the caller holds the branch's session already — and, when
    its default spec is loaded (``collab.access.access_session`` loads it) and is the branch's
    own too, the branch's read as well."""
    if session is not None and branch.agent_spec_id is not None and branch.agent_spec_id == session.agent_spec_id \
            and _spec_field(session).is_cached(session) and not _spec_field(branch).is_cached(branch):
        branch.agent_spec = session.agent_spec  # the same row, read already
    return branch.agent_spec or (session if session is not None else branch.session).agent_spec


def _spec_field(row):
    return row._meta.get_field("agent_spec")


def effective_spec_id(branch, session=None):
    """``effective_spec``'s id, read from the rows' foreign keys alone (no query)."""
    return branch.agent_spec_id or (session if session is not None else branch.session).agent_spec_id


class NameStage(models.IntegerChoices):
    """How a branch got its name (docs/contract.md#names); only LABEL names may be replaced automatically."""

    NONE = 0
    LABEL = 1  # derived from the prompt at creation
    AUTO = 2  # titled by the model in the background
    MANUAL = 3  # given explicitly (description, task_name, a person)


class Branch(models.Model):
    """A named line of the DAG ending at ``tip``: the agent.

    Name, archive state and counters belong here, not to a tip message, so they
    survive new turns. The first archive values are kept (docs/contract.md#archive).
    """

    id = id_field()
    # no index of its own: branch_session_archived leads with it
    session = models.ForeignKey("collab.Session", on_delete=models.CASCADE, related_name="branches", db_index=False)
    name = models.CharField(max_length=100, blank=True, default="")
    name_stage = models.PositiveSmallIntegerField(choices=NameStage.choices, default=NameStage.NONE)
    # not indexed: nothing looks a branch up by its tip, and the tip moves on every message — an
    # index on it would make each of those updates write a new entry in every index of the table
    # instead of a heap-only (HOT) row version. Only deleting a session's
    # messages reads branches by tip (SET_NULL), and that deletes the session's branches anyway.
    tip = models.ForeignKey(
        "collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    forked_from = models.ForeignKey(
        "collab.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks",
        help_text="the node this branch's first message follows (null for a new root)",
    )
    agent_spec = models.ForeignKey("collab.AgentSpec", null=True, blank=True, on_delete=models.SET_NULL)
    created_by_job = models.ForeignKey(
        "collab.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="created_branches"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # OpenWork children: the parent branch and the task name unique among its children
    parent_branch = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="child_branches"
    )
    task_name = models.CharField(max_length=48, null=True, blank=True)
    archived = models.BooleanField(default=False)
    archived_at = models.DateTimeField(null=True, blank=True)
    archive_reason = models.CharField(max_length=500, blank=True, default="")
    archived_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    merged_into = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the branch this one was merged into (kept apart from archived); Trellis has no merge "
                  "operation, so nothing sets it yet and it is always empty",
    )
    internal = models.BooleanField(default=False, help_text="hidden from agents' listings; shown in the UI")
    lane = models.PositiveSmallIntegerField(
        default=0,
        help_text="its column in the session's DAG, chosen when it opens (collab.dag_layout.pick_lane) and kept "
                  "for life; reused only after the branch is archived and idle",
    )
    turns = models.PositiveIntegerField(default=0)
    chars = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]
        verbose_name_plural = "branches"
        indexes = [models.Index(fields=["session", "archived"], name="branch_session_archived")]
        constraints = [
            models.CheckConstraint(
                condition=Q(archived=False) | Q(archived_at__isnull=False), name="branch_archived_has_time"
            ),
            models.CheckConstraint(condition=Q(name_stage__in=NameStage.values), name="branch_name_stage_valid"),
            models.CheckConstraint(
                condition=Q(task_name__isnull=True) | Q(task_name__regex=TASK_NAME_DB),
                name="branch_task_name_format",
            ),
            models.UniqueConstraint(
                fields=["parent_branch", "task_name"],
                condition=Q(task_name__isnull=False),
                name="branch_task_name_unique_per_parent",
            ),
        ]

    def __str__(self):
        return self.name or self.id

    @property
    def address(self) -> str | None:
        """``SID:HEAD`` of the current tip (None for a branch with no message yet): ``format_address``."""
        return format_address(self.session_id, self.tip_id)

    @property
    def effective_spec(self):
        """The AgentSpec this branch runs with: its own, else its session's (``effective_spec``)."""
        return effective_spec(self)

    @property
    def display_name(self) -> str:
        return self.name or self.id[:8]

"""Users belong to projects through memberships; projects are the tenant boundary.

This app imports nothing from ``collab``: it owns identities, roles and the
capability policy (``accounts.policy``), and the domain builds on it.
"""

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone



class Role(models.TextChoices):
    VIEWER = "viewer"
    MEMBER = "member"
    MAINTAINER = "maintainer"
    OWNER = "owner"


class WatchPolicy(models.TextChoices):
    OFF = "off"
    CONFIRM_DELIVERIES = "confirm_deliveries"


def _nonneg(name):
    return models.CheckConstraint(condition=Q(**{f"{name}__gte": 0}), name=f"project_{name}_nonneg")


def _null_or_positive(name):
    return models.CheckConstraint(
        condition=Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__gt": 0}), name=f"project_{name}_positive"
    )


# A project's slug, as every entry point accepts it (the API's schema, the projects page's form,
# ``collab.services.projects.do_create_project``): lowercase letters, digits and "-", 1–64.
PROJECT_SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,63}$"
PROJECT_NAME_CHARS = 200


class Project(models.Model):
    """A tenant. Limits live here (docs/contract.md#limits-and-defaults): topology counts use 0 = unlimited,
    resource limits use null = inherit the deployment default."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=PROJECT_NAME_CHARS)
    created_at = models.DateTimeField(default=timezone.now)

    # topology budgets (docs/contract.md#topology-budgets), 0 = unlimited
    max_spawn_depth = models.PositiveIntegerField(default=1)
    max_messages = models.PositiveIntegerField(default=8)
    max_spawn_fanout = models.PositiveIntegerField(default=8)
    # resources (docs/contract.md#resource-quotas), null = inherit
    max_live_per_session = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_queued_per_session = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_jobs_per_session = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_tokens_per_job = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_cost_per_job = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    max_idle_seconds = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    # fair share (docs/capacity.md#fair-share): jobs of this project in worker slots at once;
    # null = the deployment's cap
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    # OpenWork: running child turns per root session
    max_active_turns = models.PositiveIntegerField(default=3, validators=[MinValueValidator(1)])
    watch_policy = models.CharField(max_length=32, choices=WatchPolicy.choices, default=WatchPolicy.OFF)
    # the project-wide counterpart of an agent spec's ``approvals`` (docs/contract.md#people-in-the-loop):
    # tool names (or "*") whose every call, by any agent of the project, waits for a person's approval
    approvals = models.JSONField(default=list, blank=True,
                                 help_text='tools whose every call waits for a person\'s approval ("*": all)')
    artifact_retention_days = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1)])
    workspace = models.CharField(max_length=500, blank=True, default="")
    last_event_seq = models.PositiveBigIntegerField(default=0, help_text="sequence of project-level audit events")

    class Meta:
        ordering = ["slug"]
        constraints = [
            _nonneg("max_spawn_depth"),
            _nonneg("max_messages"),
            _nonneg("max_spawn_fanout"),
            _null_or_positive("max_live_per_session"),
            _null_or_positive("max_queued_per_session"),
            _null_or_positive("max_jobs_per_session"),
            _null_or_positive("max_tokens_per_job"),
            _null_or_positive("max_cost_per_job"),
            _null_or_positive("max_runtime_seconds"),
            _null_or_positive("max_idle_seconds"),
            _null_or_positive("max_running_jobs"),
            models.CheckConstraint(condition=Q(max_active_turns__gt=0), name="project_max_active_turns_positive"),
            models.CheckConstraint(
                condition=Q(artifact_retention_days__gt=0), name="project_artifact_retention_positive"
            ),
            models.CheckConstraint(condition=Q(watch_policy__in=WatchPolicy.values), name="project_watch_policy_valid"),
        ]

    def __str__(self):
        return self.slug


class MembershipQuerySet(models.QuerySet):
    def accepted(self):
        """Memberships that give access: the invitation was accepted (or never needed one)."""
        return self.filter(accepted_at__isnull=False)

    def pending(self):
        """Invitations still waiting for the person's answer: they give no access at all."""
        return self.filter(accepted_at__isnull=True)


class Membership(models.Model):
    """A person's role in a project. Added through the API, a page or the admin it starts as an
    *invitation* (``accepted_at`` null) that gives nothing until the person accepts it; rows
    created directly by trusted code (a new project's creator, ``manage.py demo``, fixtures)
    default to accepted. Every access check goes through ``accounts.policy.member_project_ids``
    or ``role_of``, which count accepted rows only."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(default=timezone.now)
    accepted_at = models.DateTimeField(
        null=True, blank=True, default=timezone.now, help_text="null while the invitation is pending"
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = MembershipQuerySet.as_manager()

    @property
    def status(self) -> str:
        return "active" if self.accepted_at is not None else "pending"

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_one_per_user_project"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} @ {self.project} ({self.role}{'' if self.accepted_at else ', invited'})"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class TokenScope(models.TextChoices):
    """What a bearer token may do (docs/contract.md#authentication). GETs need ``read``, other API calls ``write``,
    the tool gateway ``tools``, creating or revoking tokens ``tokens``, deciding held
    deliveries ``holds`` (never in the default set: an agent given its starter's ordinary
    token cannot approve its own held deliveries)."""

    READ = "read"
    WRITE = "write"
    TOOLS = "tools"
    TOKENS = "tokens"
    HOLDS = "holds"


DEFAULT_TOKEN_SCOPES = [TokenScope.READ.value, TokenScope.WRITE.value, TokenScope.TOOLS.value]


def default_token_scopes() -> list[str]:
    return list(DEFAULT_TOKEN_SCOPES)


class ApiTokenQuerySet(models.QuerySet):
    def active(self, now=None):
        """Usable at ``now`` (default: now): not revoked, not expired. ``now`` may be an
        expression (a prepared statement's parameter: ``accounts.policy.token_for``)."""
        return self.filter(revoked_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now() if now is None else now)
        )


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the raw value is shown once.

    A token may expire (``expires_at``) and carries scopes; revoking a token revokes the
    tokens it minted too (``issued_by``), so a stolen token cannot outlive its revocation."""

    PREFIX = "trl_"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    key_hash = models.CharField(max_length=64, unique=True)
    hint = models.CharField(max_length=12, help_text="first characters, to tell tokens apart")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="unusable from then on; empty = never")
    scopes = models.JSONField(default=default_token_scopes, help_text="read, write, tools, tokens, holds")
    issued_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="issued",
        help_text="the token that minted this one through the API (revoked with it)",
    )

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self):
        return f"{self.hint}… ({self.user})"

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def allows(self, scope: str) -> bool:
        return scope in (self.scopes or [])

    @classmethod
    def issue(cls, user, name: str = "", *, scopes=None, expires_at=None, issued_by=None) -> tuple["ApiToken", str]:
        """Store a new token; the raw value is returned once. Validation is ``accounts.services.issue_token``'s."""
        raw = cls.PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, key_hash=hash_token(raw), hint=raw[:10],
            scopes=list(scopes) if scopes is not None else default_token_scopes(),
            expires_at=expires_at, issued_by=issued_by,
        )
        return token, raw


class Profile(models.Model):
    """What Trellis keeps of a person beside Django's user row: when they last opened the home page,
    whose "finished since your last visit" starts there (docs/web-app.md#the-home-page). Created on
    their first visit (``accounts.services.note_home_visit``)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True,
                                related_name="profile")
    last_home_visit = models.DateTimeField(null=True, blank=True, help_text="when they last opened the home page")

    def __str__(self):
        return f"profile of {self.user}"

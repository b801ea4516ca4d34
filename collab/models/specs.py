from django.db import models
from django.db.models import Q
from django.utils import timezone



class Provider(models.TextChoices):
    SCRIPTED = "scripted"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class Toolset(models.TextChoices):
    COLLAB = "collab"
    OPENWORK = "openwork"


class AgentRole(models.TextChoices):
    GENERAL = "general"
    EXPLORER = "explorer"


class FollowupMode(models.TextChoices):
    TURN = "turn"
    MAILBOX = "mailbox"


class AgentSpec(models.Model):
    """A saved, reusable agent configuration, selected by ``agent_id``.

    ``agent_id`` never addresses a branch. A spec on a model API names an
    operator-owned ``connection`` (endpoint and key variable) and a ``model``; a tenant
    never types a URL or an environment variable (docs/contract.md#authorization-and-visibility). Keys are never stored.
    """

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="agent_specs")
    agent_id = models.SlugField(max_length=64)
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.SCRIPTED)
    model = models.CharField(max_length=200, blank=True, default="")
    connection = models.ForeignKey(
        "collab.ModelConnection", null=True, blank=True, on_delete=models.PROTECT, related_name="agent_specs",
    )
    system_prompt = models.TextField(blank=True, default="")
    toolset = models.CharField(max_length=16, choices=Toolset.choices, default=Toolset.COLLAB)
    role = models.CharField(max_length=16, choices=AgentRole.choices, default=AgentRole.GENERAL)
    tools = models.JSONField(default=list, blank=True, help_text="allow-list of tool names; empty = the whole toolset")
    script = models.JSONField(default=list, blank=True, help_text="scripted provider steps (docs/contract.md#the-scripted-provider)")
    followup_mode = models.CharField(max_length=16, choices=FollowupMode.choices, default=FollowupMode.TURN)
    limits = models.JSONField(default=dict, blank=True)
    approvals = models.JSONField(default=list, blank=True,
                                 help_text='tools whose every call waits for a person\'s approval; ["*"]: all')
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["agent_id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "agent_id"], name="agentspec_agent_id_unique_per_project"),
            models.CheckConstraint(condition=Q(provider__in=Provider.values), name="agentspec_provider_valid"),
            models.CheckConstraint(condition=Q(toolset__in=Toolset.values), name="agentspec_toolset_valid"),
            models.CheckConstraint(condition=Q(role__in=AgentRole.values), name="agentspec_role_valid"),
            models.CheckConstraint(condition=Q(followup_mode__in=FollowupMode.values), name="agentspec_followup_valid"),
        ]

    def __str__(self):
        return f"{self.project.slug}/{self.agent_id}"

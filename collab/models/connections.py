from django.db import models
from django.db.models import Q
from django.utils import timezone



class ConnectionProvider(models.TextChoices):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class ConnectionSource(models.TextChoices):
    ADMIN = "admin"  # defined by staff in the admin
    SETTINGS = "settings"  # mirrored from TRELLIS_MODEL_CONNECTIONS; read-only in the admin


class ModelConnection(models.Model):
    """An operator-owned model endpoint (docs/contract.md#authorization-and-visibility): where
    requests go and which worker environment variable holds the key. Tenants never type a URL or a variable name; an
    AgentSpec names a connection, and may use it only if it is bound to the spec's project
    (``all_projects`` or listed in ``projects``) and its model is allowed.

    The key itself is never stored: ``key_env`` names a variable of the worker, read at
    call time and sent only to this connection's ``base_url``.
    """

    name = models.SlugField(max_length=64, unique=True)
    provider = models.CharField(max_length=16, choices=ConnectionProvider.choices)
    base_url = models.CharField(
        max_length=500, blank=True, default="",
        help_text="http(s) URL of the API; empty = the provider's official API",
    )
    key_env = models.CharField(
        max_length=100, blank=True, default="",
        help_text="the worker environment variable holding this connection's key; empty = a keyless local server",
    )
    allowed_models = models.JSONField(default=list, blank=True, help_text="model names agents may use; empty = any")
    prices = models.JSONField(
        default=dict, blank=True,
        help_text='per-model price overrides, $ per million tokens: {"model": [input, output]}',
    )
    all_projects = models.BooleanField(default=False, help_text="every project may use it")
    projects = models.ManyToManyField("accounts.Project", blank=True, related_name="model_connections")
    enabled = models.BooleanField(default=True)
    source = models.CharField(max_length=16, choices=ConnectionSource.choices, default=ConnectionSource.ADMIN)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(provider__in=ConnectionProvider.values), name="connection_provider_valid"),
            models.CheckConstraint(condition=Q(source__in=ConnectionSource.values), name="connection_source_valid"),
            models.CheckConstraint(condition=~Q(name=""), name="connection_name_not_empty"),
            models.CheckConstraint(
                condition=Q(base_url="") | Q(base_url__startswith="http://") | Q(base_url__startswith="https://"),
                name="connection_base_url_http",
            ),
        ]

    def __str__(self):
        return self.name

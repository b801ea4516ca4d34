"""Operator admin. Every model is visible; the event log is read-only.

Admin *actions* that change collaboration state (archive, cancel) arrive with
the services of later issues and must call those services, never write rows.
"""

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db import transaction

from accounts.admin import ProjectAdmin
from accounts.models import Project
from collab.events import send_event_on_commit
from collab.services.connections import sync_settings_connections
from config.model_connections import KEY_ENV_RE, check_base_url, check_prices
from collab.services.archive import do_archive_branch
from collab.services.cancel import request_cancel_tree
from collab.services.projects import do_set_workspace
from collab.services.workspace import WorkspaceError, check_workspace_path

from collab.models import (
    AgentSpec,
    Artifact,
    Branch,
    Event,
    ExecutionCommand,
    HeldDelivery,
    InboxEntry,
    Job,
    Message,
    ModelConnection,
    Session,
    Todo,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ProjectForm(forms.ModelForm):
    def clean_workspace(self):
        """The same rule as ``manage.py workspace`` (P-SEC-5): an existing directory, not ``/``,
        not containing or inside Trellis's own files."""
        path = (self.cleaned_data.get("workspace") or "").strip()
        if not path:
            return ""
        try:
            return str(check_workspace_path(path))
        except WorkspaceError as exc:
            raise forms.ValidationError(exc.detail, code=exc.code) from None


admin.site.unregister(Project)


@admin.register(Project)
class ProjectWorkspaceAdmin(ProjectAdmin):
    """The accounts app's project admin, with the workspace (a collab concern; accounts imports
    nothing from collab) validated by the form and written through ``do_set_workspace``, audited."""

    form = ProjectForm

    def save_model(self, request, obj, form, change):
        workspace = obj.workspace
        if "workspace" in form.changed_data:
            obj.workspace = form.initial.get("workspace") or ""
        super().save_model(request, obj, form, change)
        if "workspace" in form.changed_data:
            do_set_workspace(request.user, obj, workspace)


@admin.register(AgentSpec)
class AgentSpecAdmin(admin.ModelAdmin):
    list_display = ["agent_id", "project", "provider", "model", "toolset", "role", "followup_mode"]
    list_filter = ["provider", "toolset", "role"]
    search_fields = ["agent_id", "project__slug"]


class ModelConnectionForm(forms.ModelForm):
    class Meta:
        model = ModelConnection
        fields = ["name", "provider", "base_url", "key_env", "allowed_models", "prices", "all_projects", "projects",
                  "enabled"]

    def clean_base_url(self):
        url = (self.cleaned_data.get("base_url") or "").strip()
        problem = check_base_url(url)
        if problem:
            raise forms.ValidationError(f"base URL {problem}")
        return url

    def clean_key_env(self):
        name = (self.cleaned_data.get("key_env") or "").strip()
        if name and not KEY_ENV_RE.fullmatch(name):
            raise forms.ValidationError("an environment variable name (letters, digits, _)")
        return name

    def clean_allowed_models(self):
        models = self.cleaned_data.get("allowed_models") or []
        if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
            raise forms.ValidationError('a JSON list of model names, e.g. ["gpt-4.1-mini"]')
        return [m.strip() for m in models]

    def clean_prices(self):
        prices = self.cleaned_data.get("prices") or {}
        problem = check_prices(prices)
        if problem:
            raise forms.ValidationError(problem)
        return prices


@admin.register(ModelConnection)
class ModelConnectionAdmin(admin.ModelAdmin):
    """Operator-owned model endpoints (P-SEC-0). Connections from TRELLIS_MODEL_CONNECTIONS are
    shown with source "settings" and are read-only here (edit the setting instead)."""

    form = ModelConnectionForm
    list_display = ["name", "provider", "base_url", "key_env", "all_projects", "enabled", "source"]
    list_filter = ["provider", "source", "enabled"]
    search_fields = ["name", "base_url"]
    filter_horizontal = ["projects"]

    def changelist_view(self, request, extra_context=None):
        sync_settings_connections()
        return super().changelist_view(request, extra_context)

    def _from_settings(self, obj) -> bool:
        return obj is not None and obj.source == "settings"

    def has_change_permission(self, request, obj=None):
        return not self._from_settings(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return not self._from_settings(obj) and super().has_delete_permission(request, obj)


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "project", "created_by", "parent_session", "agent_role", "last_active_at"]
    list_filter = ["project"]
    search_fields = ["id", "title"]
    raw_id_fields = ["head", "parent_session", "agent_spec", "created_by"]


class ReasonForm(ActionForm):
    reason = forms.CharField(required=False, max_length=500, label="Reason")


@admin.register(Branch)
class BranchAdmin(admin.ModelAdmin):
    """Operators archive (one or many, with a reason) and flag branches through the same
    services as every other path, so each change writes its Event."""

    list_display = ["id", "name", "session", "archived", "internal", "turns", "chars", "last_active_at"]
    list_filter = ["archived", "internal"]
    search_fields = ["id", "name", "session__id"]
    readonly_fields = [f.name for f in Branch._meta.fields]
    action_form = ReasonForm
    actions = ["archive_branches", "mark_internal", "unmark_internal"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Archive selected branches (with the reason above)")
    def archive_branches(self, request, queryset):
        reason = request.POST.get("reason", "")
        for branch in queryset.select_related("session"):
            do_archive_branch(branch, user=request.user, reason=reason or "archived by an operator")
        self.message_user(request, f"archived {queryset.count()} branches", messages.SUCCESS)

    def _set_internal(self, request, queryset, value: bool):
        with transaction.atomic():
            for branch in queryset.select_for_update():
                if branch.internal != value:
                    Branch.objects.filter(pk=branch.pk).update(internal=value)
                    send_event_on_commit(branch.session_id, "branch.internal_changed",
                                         {"branch": branch.pk, "internal": value}, actor=request.user)

    @admin.action(description="Mark selected branches internal (UI-only)")
    def mark_internal(self, request, queryset):
        self._set_internal(request, queryset, True)

    @admin.action(description="Clear the internal flag")
    def unmark_internal(self, request, queryset):
        self._set_internal(request, queryset, False)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "branch", "role", "kind", "depth", "created_at"]
    list_filter = ["role", "kind"]
    search_fields = ["id", "session__id"]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "status", "version", "session", "branch", "is_error", "created_at", "finished_at"]
    list_filter = ["status", "kind", "is_error"]
    search_fields = ["id", "session__id"]
    actions = ["cancel_executions"]

    @admin.action(description="Cancel selected executions (and their descendants)")
    def cancel_executions(self, request, queryset):
        count = 0
        for job in queryset:
            with transaction.atomic():
                locked = Job.objects.select_for_update().get(pk=job.pk)
                if locked.is_terminal:
                    continue
                cascaded = request_cancel_tree(locked, request.user)
                send_event_on_commit(locked.session_id, "execution.cancel_requested",
                                     {"job": locked.pk, "command_id": f"admin-{uuid.uuid4().hex}",
                                      "cascaded": cascaded, "via": "admin"}, actor=request.user)
                count += 1
        self.message_user(request, f"cancel requested for {count} executions", messages.SUCCESS)


@admin.register(ExecutionCommand)
class ExecutionCommandAdmin(ReadOnlyAdmin):
    list_display = ["command_id", "job", "action", "expected_version", "response_status", "created_at"]


@admin.register(InboxEntry)
class InboxEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "target_branch", "kind", "sender_address", "created_at"]


@admin.register(HeldDelivery)
class HeldDeliveryAdmin(ReadOnlyAdmin):
    """Deliveries held by a watch policy; decided on the session page or through the API."""

    list_display = ["id", "project", "kind", "status", "sender_session", "target_branch", "created_at", "decided_by"]
    list_filter = ["status", "kind", "project"]


@admin.register(Todo)
class TodoAdmin(admin.ModelAdmin):
    list_display = ["id", "subject", "status", "session", "branch", "updated_at"]
    list_filter = ["status"]
    raw_id_fields = ["session", "branch", "blocked_by"]


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "session", "media_type", "size_bytes", "created_at", "expires_at"]
    exclude = ["content"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "project", "session", "seq", "type", "actor"]
    list_filter = ["type", "project", ("actor", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["session__id", "type", "actor__username"]
    date_hierarchy = "created_at"

"""Operator admin. Every model is visible; rows the app writes (sessions, messages, jobs,
the event log…) are read-only here and change only through the actions below.

Every edit and action needs its Django permission (view-only staff can
look, never act), goes through the same service as the pages and the API — archive,
internal flag, the versioned cancel command (an ``ExecutionCommand``), spec edits,
visibility — and so writes its Event; no admin code writes a row itself. A service's
refusal shows as a message and writes nothing. The accounts models' admin is in
``collab.admin_accounts`` for the same reason.
"""

import json
import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.utils.translation import ngettext

from collab import admin_accounts  # noqa: F401 - registers the accounts models (edits through collab services)
from collab.admin_base import ReadOnlyAdmin, ServiceAdmin
from collab.events import with_full_payloads
from collab.selectors.capacity import capacity
from collab.services.archive import do_archive_branch
from collab.services.branches import do_set_branch_internal
from collab.services.cancel import CANCEL, do_execution_command
from collab.services.visibility import do_set_visibility, do_share, do_unshare
from collab.services.specs import SPEC_FIELDS, do_add_agent_spec, do_delete_agent_spec, do_update_agent_spec
from collab.services.connections import sync_settings_connections
from collab.conf.model_connections import KEY_ENV_RE, check_base_url, check_prices

from collab.models import (
    AgentSpec,
    Artifact,
    Branch,
    Event,
    ExecutionCommand,
    Webhook,
    WebhookDelivery,
    HeldDelivery,
    InboxEntry,
    PersonAsk,
    Job,
    Message,
    ModelConnection,
    Session,
    SessionShare,
    Todo,
)

admin.site.site_header = "Trellis administration"  # the banner on every admin page
admin.site.site_title = "Trellis admin"  # the browser tab's suffix
admin.site.index_title = "Trellis administration"


@admin.register(AgentSpec)
class AgentSpecAdmin(ServiceAdmin):
    """Spec edits are validated like the API's and audited (``agent_spec.*`` events)."""

    list_display = ["agent_id", "project", "provider", "model", "toolset", "role", "followup_mode"]
    list_filter = ["provider", "toolset", "role"]
    search_fields = ["agent_id", "project__slug"]
    actions = ["delete_specs"]

    def get_readonly_fields(self, request, obj=None):
        return ["project", "agent_id", "created_at"] if obj is not None else ["created_at"]

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # replaced by delete_specs, which audits
        return actions

    def save_model(self, request, obj, form, change):
        if change:
            current = AgentSpec.objects.get(pk=obj.pk)  # the form already changed ``obj``
            do_update_agent_spec(request.user, current, {f: form.cleaned_data[f] for f in form.changed_data
                                                         if f in SPEC_FIELDS})
        else:
            data = {f: form.cleaned_data[f] for f in SPEC_FIELDS if f in form.cleaned_data}
            obj.pk = do_add_agent_spec(request.user, form.cleaned_data["project"], **data).pk
        obj.refresh_from_db()

    def delete_model(self, request, obj):
        do_delete_agent_spec(request.user, obj)

    @admin.action(description="Delete selected agent specs", permissions=["delete"])
    def delete_specs(self, request, queryset):
        for spec in queryset:
            do_delete_agent_spec(request.user, spec)
        self.message_user(request, "deleted", messages.SUCCESS)


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
    """Operator-owned model endpoints (docs/contract.md#authorization-and-visibility). Connections
    from TRELLIS_MODEL_CONNECTIONS are shown with source "settings" and are read-only here (edit
    the setting instead)."""

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


class ShareForm(ActionForm):
    username = forms.CharField(required=False, max_length=150, label="Member")
    role = forms.ChoiceField(required=False, choices=[(r, r) for r in ("viewer", "member", "maintainer", "owner")],
                             label="Role")


@admin.register(SessionShare)
class SessionShareAdmin(ReadOnlyAdmin):
    """Who a shared session is shared with, looked at; shares change through the session actions
    below (or the page and the API), which go through the visibility service."""

    list_display = ["session", "user", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["session__id", "user__username"]
    raw_id_fields = ["session", "user"]


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    """Sessions change through the app (turns, forks, sharing); here they are looked at. Operators with
    ``collab.change_session`` set who sees them through the same service as the page
    and the API, so each change writes its Event and closes the sockets of those who lose access."""

    list_display = ["id", "title", "project", "visibility", "created_by", "parent_session", "agent_role",
                    "last_active_at"]
    list_filter = ["project", "visibility"]
    search_fields = ["id", "title"]
    raw_id_fields = ["head", "parent_session", "agent_spec", "created_by"]
    action_form = ShareForm
    actions = ["make_project", "make_private", "make_shared", "share_with", "unshare_with"]

    def has_visibility_permission(self, request):
        return request.user.has_perm("collab.change_session")

    def _each(self, request, queryset, change) -> None:
        """A refusal (a child session, a non-member, a too-wide role) rolls the whole action back."""
        sessions = list(queryset)
        for session in sessions:
            change(session)
        noun = ngettext("session", "sessions", len(sessions))
        self.message_user(request, f"{len(sessions)} {noun} changed", messages.SUCCESS)

    def _set(self, request, queryset, visibility):
        self._each(request, queryset, lambda s: do_set_visibility(request.user, s, visibility, operator=True))

    @admin.action(description="Visible to the whole project", permissions=["visibility"])
    def make_project(self, request, queryset):
        self._set(request, queryset, "project")

    @admin.action(description="Private (creator, maintainers and owners)", permissions=["visibility"])
    def make_private(self, request, queryset):
        self._set(request, queryset, "private")

    @admin.action(description="Shared (creator and the members it is shared with)", permissions=["visibility"])
    def make_shared(self, request, queryset):
        self._set(request, queryset, "shared")

    @admin.action(description="Share with the member above (with the role above)", permissions=["visibility"])
    def share_with(self, request, queryset):
        username, role = request.POST.get("username", "").strip(), request.POST.get("role") or "viewer"
        self._each(request, queryset, lambda s: do_share(request.user, s, username, role, operator=True))

    @admin.action(description="Stop sharing with the member above", permissions=["visibility"])
    def unshare_with(self, request, queryset):
        username = request.POST.get("username", "").strip()
        self._each(request, queryset, lambda s: do_unshare(request.user, s, username, operator=True))


class ReasonForm(ActionForm):
    reason = forms.CharField(required=False, max_length=500, label="Reason")


@admin.register(Branch)
class BranchAdmin(ServiceAdmin):
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

    @admin.action(description="Archive selected branches (with the reason above)", permissions=["change"])
    def archive_branches(self, request, queryset):
        reason = request.POST.get("reason", "")
        branches = list(queryset.select_related("session"))
        for branch in branches:
            do_archive_branch(branch, user=request.user, reason=reason or "archived by an operator")
        noun = ngettext("branch", "branches", len(branches))
        self.message_user(request, f"archived {len(branches)} {noun}", messages.SUCCESS)

    def _set_internal(self, request, queryset, value: bool):
        changed = sum(do_set_branch_internal(request.user, branch, value) for branch in queryset)
        self.message_user(request, f"{changed} {ngettext('branch', 'branches', changed)} changed", messages.SUCCESS)

    @admin.action(description="Mark selected branches internal (hidden from agents' listings)", permissions=["change"])
    def mark_internal(self, request, queryset):
        self._set_internal(request, queryset, True)

    @admin.action(description="Clear the internal flag", permissions=["change"])
    def unmark_internal(self, request, queryset):
        self._set_internal(request, queryset, False)


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ["id", "session", "branch", "role", "kind", "depth", "created_at"]
    list_filter = ["role", "kind"]
    search_fields = ["id", "session__id"]


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "status", "version", "session", "branch", "worker", "is_error", "created_at",
                    "finished_at"]
    list_filter = ["status", "kind", "is_error"]
    search_fields = ["id", "session__id", "worker"]
    actions = ["cancel_executions"]

    def changelist_view(self, request, extra_context=None):
        """Above the list: the turn slots in use per worker process and the queue
        (``collab.selectors.capacity``)."""
        return super().changelist_view(request, {**(extra_context or {}), "capacity": capacity()})

    def get_object(self, request, object_id, from_field=None):
        """The job with its prompt and result shown whichever row holds them (each is stored once;
        ``Job.prompt_text`` and ``Job.result`` read either), as the page showed them before.
        Read-only: nothing saves it."""
        job = super().get_object(request, object_id, from_field)
        if job is not None:
            job.prompt, job.result_text = job.prompt_text, job.result
        return job

    def has_cancel_permission(self, request):
        """Cancelling is changing a job: the ``collab.change_job`` permission (rows stay read-only)."""
        return request.user.has_perm("collab.change_job")

    @admin.action(description="Cancel selected executions (and their descendants)", permissions=["cancel"])
    def cancel_executions(self, request, queryset):
        """The versioned cancel command, as the API sends it: recorded as an ExecutionCommand,
        with its ``execution.cancel_requested`` event."""
        count = 0
        for job in queryset:
            if job.is_terminal:
                continue
            do_execution_command(request.user, job, command_id=f"admin-{uuid.uuid4().hex}", action=CANCEL,
                                 expected_version=job.version, payload={}, operator=True)
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


@admin.register(PersonAsk)
class PersonAskAdmin(ReadOnlyAdmin):
    """Tool calls and questions waiting for a person (docs/contract.md#people-in-the-loop); decided in
    the inbox or through the API."""

    list_display = ["id", "project", "kind", "tool", "status", "session", "to_user", "created_at", "decided_by"]
    list_filter = ["status", "kind", "project"]
    raw_id_fields = ["session", "branch", "job", "call_message"]


@admin.register(Todo)
class TodoAdmin(ReadOnlyAdmin):
    """The agents' plans: changed by their tools, looked at here."""

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
    exclude = ["payload"]
    readonly_fields = ["full_payload"]

    @admin.display(description="payload")
    def full_payload(self, event):
        """The payload as every reader of the log sees it: a row stored as a reference
        is given its whole payload back."""
        return json.dumps(with_full_payloads([event])[0].payload, indent=2, ensure_ascii=False)


@admin.register(Webhook)
class WebhookAdmin(ReadOnlyAdmin):
    """Project webhooks: registered, changed and rotated by the project's
    maintainers through the API or the project page (audited there); the signing secret is
    never shown."""

    list_display = ["id", "project", "url", "active", "created_by", "created_at", "secret_rotated_at"]
    list_filter = ["active", "project"]
    exclude = ["secret"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """What each webhook was sent: status, attempts, the last HTTP status and Trellis's reason."""

    list_display = ["id", "webhook", "job", "status", "attempts", "last_status_code", "last_error_code",
                    "next_attempt_at", "delivered_at", "created_at"]
    list_filter = ["status", "project"]
    raw_id_fields = ["webhook", "project", "job"]



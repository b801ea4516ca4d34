"""Operator admin. Every model is visible; the event log is read-only.

Admin *actions* that change collaboration state (archive, cancel) arrive with
the services of later issues and must call those services, never write rows.
"""

from django.contrib import admin

from collab.models import (
    AgentSpec,
    Artifact,
    Branch,
    Event,
    ExecutionCommand,
    InboxEntry,
    Job,
    Message,
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


@admin.register(AgentSpec)
class AgentSpecAdmin(admin.ModelAdmin):
    list_display = ["agent_id", "project", "provider", "model", "toolset", "role", "followup_mode"]
    list_filter = ["provider", "toolset", "role"]
    search_fields = ["agent_id", "project__slug"]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "project", "created_by", "parent_session", "last_active_at"]
    list_filter = ["project"]
    search_fields = ["id", "title"]
    raw_id_fields = ["head", "parent_session", "agent_spec", "created_by"]


@admin.register(Branch)
class BranchAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "session", "archived", "internal", "turns", "chars", "last_active_at"]
    list_filter = ["archived", "internal"]
    search_fields = ["id", "name", "session__id"]
    raw_id_fields = ["session", "tip", "created_by_job", "parent_branch", "merged_into", "agent_spec"]
    readonly_fields = ["archived", "archived_at", "archive_reason", "archived_by"]


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


@admin.register(ExecutionCommand)
class ExecutionCommandAdmin(ReadOnlyAdmin):
    list_display = ["command_id", "job", "action", "expected_version", "response_status", "created_at"]


@admin.register(InboxEntry)
class InboxEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "target_branch", "kind", "sender_address", "created_at"]


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
    list_display = ["session", "seq", "type", "actor", "created_at"]
    list_filter = ["type"]
    search_fields = ["session__id", "type"]

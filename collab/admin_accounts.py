"""The admin of the accounts models (projects, memberships, tokens, profiles).

It lives on the collab side because their edits go through collab's services, which
write the audit Events and close the sockets of people who lost access (accounts
imports nothing from collab). Every edit needs its Django permission.
"""

from django import forms
from django.contrib import admin, messages
from django.utils.translation import ngettext

from accounts.limits import FIELDS as LIMIT_FIELDS
from accounts.models import ApiToken, Membership, Profile, Project
from collab.admin_base import ReadOnlyAdmin, ServiceAdmin
from collab.services.members import do_add_member, do_change_role, do_remove_member
from collab.services.projects import do_set_limits, do_set_workspace, do_update_project
from collab.services.tokens import do_revoke_token
from collab.workspace import WorkspaceError, check_workspace_path

PROJECT_FIELDS = ("name", "watch_policy")


class MembershipInline(admin.TabularInline):
    """Saved by ``ProjectAdmin.save_formset`` through the membership services."""

    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    readonly_fields = ["created_at"]


class ProjectForm(forms.ModelForm):
    def clean_workspace(self):
        """The same rule as ``manage.py workspace``: an existing directory, not ``/``,
        not containing or inside Trellis's own files."""
        path = (self.cleaned_data.get("workspace") or "").strip()
        if not path:
            return ""
        try:
            return str(check_workspace_path(path))
        except WorkspaceError as exc:
            raise forms.ValidationError(exc.detail, code=exc.code) from None


@admin.register(Project)
class ProjectAdmin(ServiceAdmin):
    """Name, watch policy, limits (within the operator's ceilings) and the workspace, each
    through its service; projects are created by people (the app or the API)."""

    list_display = ["slug", "name", "created_at", "watch_policy"]
    search_fields = ["slug", "name"]
    form = ProjectForm
    inlines = [MembershipInline]
    readonly_fields = ["slug", "created_at", "last_event_seq"]
    fields = ["slug", "name", "watch_policy", "workspace", *LIMIT_FIELDS, "created_at", "last_event_seq"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a tenant's whole history: not a click in the admin

    def save_model(self, request, obj, form, change):
        current = Project.objects.get(pk=obj.pk)  # the form already changed ``obj``
        changed = set(form.changed_data)
        data = form.cleaned_data
        if changed & set(PROJECT_FIELDS):
            do_update_project(request.user, current, **{f: data[f] for f in PROJECT_FIELDS if f in changed})
        limits = {f: data[f] for f in LIMIT_FIELDS if f in changed}
        if limits:
            do_set_limits(request.user, current, limits)
        if "workspace" in changed:
            do_set_workspace(request.user, current, data["workspace"])

    def save_formset(self, request, form, formset, change):
        project = form.instance
        formset.save(commit=False)
        for membership in formset.deleted_objects:
            do_remove_member(request.user, project, membership.user.username)
        for membership, _fields in formset.changed_objects:
            do_change_role(request.user, project, membership.user.username, membership.role)
        for membership in formset.new_objects:
            do_add_member(request.user, project, membership.user.username, membership.role)


@admin.register(Membership)
class MembershipAdmin(ServiceAdmin):
    """Adding, changing a role, removing: the membership services (the last-owner rule, events,
    sockets of a removed member closed)."""

    list_display = ["user", "project", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]
    autocomplete_fields = ["user", "project"]
    actions = ["remove_members"]

    def get_readonly_fields(self, request, obj=None):
        return ["user", "project", "created_at"] if obj is not None else ["created_at"]

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # replaced by remove_members, which goes through the service
        return actions

    def save_model(self, request, obj, form, change):
        if change:
            do_change_role(request.user, obj.project, obj.user.username, obj.role)
        else:
            obj.pk = do_add_member(request.user, obj.project, obj.user.username, obj.role).pk

    def delete_model(self, request, obj):
        do_remove_member(request.user, obj.project, obj.user.username)

    @admin.action(description="Remove selected members from their projects", permissions=["delete"])
    def remove_members(self, request, queryset):
        rows = list(queryset.select_related("user", "project"))
        for membership in rows:
            do_remove_member(request.user, membership.project, membership.user.username)
        noun = ngettext("membership", "memberships", len(rows))
        self.message_user(request, f"removed {len(rows)} {noun}", messages.SUCCESS)


@admin.register(ApiToken)
class ApiTokenAdmin(ServiceAdmin):
    """Tokens are looked at and revoked (with the tokens they minted); they are created by their
    owners (the account page, the API, ``manage.py create_api_token``)."""

    list_display = ["hint", "user", "name", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
    search_fields = ["user__username", "name", "hint"]
    list_filter = ["revoked_at"]
    actions = ["revoke_tokens"]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in ApiToken._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row stays as the record

    def has_change_permission(self, request, obj=None):
        return False  # every field is read-only; revoking is the action below

    def has_revoke_permission(self, request):
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke selected tokens (and the tokens they minted)", permissions=["revoke"])
    def revoke_tokens(self, request, queryset):
        revoked = []
        for token in queryset.filter(revoked_at__isnull=True):
            revoked += do_revoke_token(request.user, token)
        noun = ngettext("token", "tokens", len(revoked))
        self.message_user(request, f"revoked {len(revoked)} {noun}", messages.SUCCESS)


@admin.register(Profile)
class ProfileAdmin(ReadOnlyAdmin):
    """Looked at only: a person's last visit of the home page is theirs to move, by visiting it."""

    list_display = ["user", "last_home_visit"]
    search_fields = ["user__username"]

from django.contrib import admin

from accounts.models import ApiToken, Membership, Project


def _as_invitation(membership, request) -> None:
    """Someone added through the admin is invited like anywhere else (issue 11 item 3): the row is
    pending until they accept it on the projects page or through the API."""
    membership.accepted_at = None
    membership.invited_by = request.user


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    fields = ["user", "role", "accepted_at", "invited_by"]
    readonly_fields = ["accepted_at", "invited_by"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at", "watch_policy"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def save_formset(self, request, form, formset, change):
        if formset.model is Membership:
            memberships = formset.save(commit=False)
            for membership in memberships:
                if membership.pk is None:
                    _as_invitation(membership, request)
                membership.save()
            for gone in formset.deleted_objects:
                gone.delete()
            return
        super().save_formset(request, form, formset, change)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "status", "created_at", "accepted_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]
    readonly_fields = ["accepted_at", "invited_by"]

    def save_model(self, request, obj, form, change):
        if not change:
            _as_invitation(obj, request)
        super().save_model(request, obj, form, change)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["hint", "user", "name", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["key_hash", "hint", "created_at", "last_used_at"]
    search_fields = ["user__username", "name", "hint"]

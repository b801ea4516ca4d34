"""What every admin page of Trellis shares: a service's refusal is a message, never a 500.

Its own module so that ``collab.admin`` and ``collab.admin_accounts`` both build on it without
importing each other."""

from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpResponseRedirect

from accounts.limits import LimitError
from collab.errors import DomainError


class ServiceAdmin(admin.ModelAdmin):
    """A service's refusal (a domain error, a bad limit) during a save, a delete or an action
    rolls the whole request back and is shown to the operator, never a 500."""

    def _refused(self, request, view, *args, **kwargs):
        try:
            with transaction.atomic():
                return view(request, *args, **kwargs)
        except (DomainError, LimitError) as exc:
            self.message_user(request, f"refused: {getattr(exc, 'detail', None) or exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def changeform_view(self, request, *args, **kwargs):
        return self._refused(request, super().changeform_view, *args, **kwargs)

    def changelist_view(self, request, *args, **kwargs):
        return self._refused(request, super().changelist_view, *args, **kwargs)

    def delete_view(self, request, *args, **kwargs):
        return self._refused(request, super().delete_view, *args, **kwargs)


class ReadOnlyAdmin(ServiceAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

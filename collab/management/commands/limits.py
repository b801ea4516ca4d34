"""``manage.py limits``: the operator's door to a project's limits
(docs/contract.md#limits-and-defaults), through the same audited service as the settings page,
the API and the admin (a ``limits.changed`` event with no actor: the operator at the console)."""

from django.core.management.base import BaseCommand, CommandError

from accounts.limits import FIELDS, LimitError, limits_of
from accounts.models import Project
from collab.services.projects import do_set_limits


class Command(BaseCommand):
    help = "Show or change a project's limits: manage.py limits SLUG [field=value …] (value 'null' inherits)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("changes", nargs="*", metavar="field=value")

    def handle(self, *args, slug, changes, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}")
        parsed = {}
        for item in changes:
            field, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"expected field=value, got {item!r}; fields: {', '.join(FIELDS)}")
            parsed[field.strip()] = None if value.strip().lower() in ("null", "none", "") else value.strip()
        if parsed:
            try:
                do_set_limits(None, project, parsed)
            except LimitError as exc:
                raise CommandError(str(exc)) from None
        for field, value in limits_of(project).items():
            self.stdout.write(f"{field} = {'null' if value is None else value}")

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Project
from collab.errors import DomainError
from collab.services.projects import do_set_workspace
from collab.sandbox import sandbox_status


class Command(BaseCommand):
    help = (
        "Show or set the directory a project's explorers may read (OpenWork workspace): "
        "manage.py workspace SLUG [PATH | --clear]. The worker processes must see the same path."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("path", nargs="?")
        parser.add_argument("--clear", action="store_true", help="remove the workspace")

    def handle(self, *args, slug, path, clear, **options):
        project = Project.objects.filter(slug=slug).first()
        if project is None:
            raise CommandError(f"no project {slug!r}")
        if clear or path:
            try:
                do_set_workspace(None, project, "" if clear else path)
            except DomainError as exc:
                raise CommandError(exc.detail) from None
        self.stdout.write(f"workspace = {project.workspace or '(none)'}")
        ok, reason = sandbox_status()
        self.stdout.write("bash: sandboxed with bubblewrap" if ok else f"bash: not offered ({reason})")

from django.core.management.base import BaseCommand, CommandError

from accounts.models import Project
from collab.services.artifacts import cleanup_expired_artifacts


class Command(BaseCommand):
    help = "Delete artifacts past their project's retention (only expired ones)."

    def add_arguments(self, parser):
        parser.add_argument("--project", help="only this project's artifacts (slug)")

    def handle(self, *args, project=None, **options):
        scope = None
        if project:
            scope = Project.objects.filter(slug=project).first()
            if scope is None:
                raise CommandError(f"no project {project!r}")
        self.stdout.write(f"deleted {cleanup_expired_artifacts(project=scope)} expired artifacts")

from django.db import IntegrityError, transaction

from accounts.models import Membership, Project, Role


class SlugTaken(Exception):
    pass


def create_project(user, *, slug: str, name: str) -> Project:
    """A new project owned by ``user``."""
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=slug, name=name or slug)
            Membership.objects.create(user=user, project=project, role=Role.OWNER)
    except IntegrityError:
        raise SlugTaken(slug) from None
    return project

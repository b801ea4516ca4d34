from django.core.management.base import BaseCommand

from collab.services.reconcile import reconcile


class Command(BaseCommand):
    help = "Recover from crashed workers: interrupt jobs whose lease expired, re-enqueue lost jobs, settle owed follow-ups."

    def handle(self, *args, **options):
        result = reconcile()
        for key, ids in result.items():
            self.stdout.write(f"{key}: {len(ids)}" + (f" ({', '.join(ids)})" if ids else ""))

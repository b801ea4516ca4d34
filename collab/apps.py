from django.apps import AppConfig


class CollabConfig(AppConfig):
    name = "collab"
    verbose_name = "Collaboration"

"""Naming worker processes, in one format: ``<host>:<pid>`` (``process_name``).

A job's ``worker`` field records the process that claimed it that way. django-q2 names each
cluster after a random uuid read as words (``humanize``), so a healthy worker could introduce
itself as "Q Cluster failed-echo-… running."; Trellis names it ``trellis-<host>:<pid>`` instead,
with the pid of the ``qcluster`` process (its sentinel and workers are forked from it and keep
the name).
"""

import os
import socket
import sys
import uuid

from django.conf import settings


def process_name(pid: int | None = None) -> str:
    """``host:pid`` of this process (or of ``pid`` on this host). Read when it is needed, never at
    import: the qcluster's main process imports collab's modules before it forks its workers."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


def cluster_name(pid: int | None = None) -> str:
    return f"trellis-{process_name(pid)}"


def install() -> str:
    """Name this process's cluster. django-q2 reads the name through the module-level
    ``humanize`` of ``django_q.cluster`` (``Cluster.name`` and the sentinel's log lines),
    so that one reference is replaced; task names (``django_q.tasks``) keep theirs."""
    # app registry: apps.py imports this module, and django_q.cluster runs django.setup() if imported that early
    import django_q.cluster

    name = cluster_name()
    if "worker_name" in settings.TRELLIS_STOCK:  # django-q2's own words for the cluster
        return django_q.cluster.humanize(uuid.uuid4().hex)
    django_q.cluster.humanize = lambda _hex, name=name: name
    return name


def is_worker_process(argv=None) -> bool:
    argv = sys.argv if argv is None else argv
    return len(argv) > 1 and argv[1] == "qcluster"

"""The worker's name in its own output (issue 13 item 8).

django-q2 names each cluster after a random uuid read as words (``humanize``), so a
healthy worker could introduce itself as "Q Cluster failed-echo-… running." Trellis gives
the cluster a stable, neutral name instead: ``trellis-<host>-<pid>`` (the pid of the
``qcluster`` process; its sentinel and workers are forked from it and keep the name), the
same host and pid a job's ``worker`` field records.
"""

import os
import socket
import sys


def cluster_name(pid: int | None = None) -> str:
    return f"trellis-{socket.gethostname()}-{pid or os.getpid()}"


def install() -> str:
    """Name this process's cluster. django-q2 reads the name through the module-level
    ``humanize`` of ``django_q.cluster`` (``Cluster.name`` and the sentinel's log lines),
    so that one reference is replaced; task names (``django_q.tasks``) keep theirs."""
    # app registry: apps.py imports this module, and django_q.cluster runs django.setup() if imported that early
    import django_q.cluster

    name = cluster_name()
    django_q.cluster.humanize = lambda _hex, name=name: name
    return name


def is_worker_process(argv=None) -> bool:
    argv = sys.argv if argv is None else argv
    return len(argv) > 1 and argv[1] == "qcluster"

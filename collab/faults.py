"""Fault points: named places in a write path where a process can be made to die as a crash
would take it (the reliability suite, tests/reliability, R2).

Off unless the operator's environment sets ``TRELLIS_FAULT_DIR`` (settings; never set in a
deployment): then ``fault_point(name)`` looks for an arming file ``DIR/name`` (or
``DIR/name#anything``, to arm a point several times), and the first process to pass the point
removes one such file — an atomic unlink, so each arming fires exactly once across every
process sharing the directory — notes its pid in ``DIR/name.fired`` and SIGKILLs itself: no
``finally``, no rollback handler, no ``on_commit`` runs, exactly as when the machine dies there.
Without the variable a point costs one settings lookup.
"""

import os
import signal

from django.conf import settings


def fault_point(name: str) -> None:
    directory = getattr(settings, "TRELLIS_FAULT_DIR", "")
    if not directory:
        return
    try:
        armed = sorted(entry for entry in os.listdir(directory) if entry == name or entry.startswith(name + "#"))
    except FileNotFoundError:
        return
    for entry in armed:
        try:
            os.unlink(os.path.join(directory, entry))
        except FileNotFoundError:
            continue  # another process took this arming
        with open(os.path.join(directory, f"{name}.fired"), "a") as out:
            out.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)

"""A worker task named by its dotted path, which django-q2 runs without looking it up each time.

``async_task("collab.tasks.run_turn", …)`` hands django-q2 a string, and its worker resolves a
string with ``pydoc.locate`` on every task — an import attempt per dotted part, the last one
failing — about 2.5 % of the worker cluster's CPU under the turns bench (py-spy).
A callable it calls as it is. ``TaskPath`` is the path itself (a ``str``: it pickles, prints,
logs and compares as the path — ``task["func"] == "collab.tasks.run_turn"`` holds) and, called,
runs the function it names (from its module as it is loaded: an import, then an attribute).

Paths come from the code only (module constants), never from input: the broker's payload is
signed (django-q2), and nothing a tenant sends names a task.
"""

import importlib


class TaskPath(str):
    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _resolve(str(self))(*args, **kwargs)


def _resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)

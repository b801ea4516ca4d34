"""One object per process, built on first use and again in a forked child (its own sockets, its
own TLS context), shared by the process's threads."""

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PerProcess:
    """``PerProcess(build)()`` is ``build()``'s result, built once per process id."""

    def __init__(self, build: Callable[[], T]):
        self._build = build
        self._lock = threading.Lock()
        self._built: dict[int, T] = {}

    def __call__(self) -> T:
        pid = os.getpid()
        value = self._built.get(pid)
        if value is None:
            with self._lock:
                value = self._built.get(pid)
                if value is None:
                    value = self._built[pid] = self._build()
        return value

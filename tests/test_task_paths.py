"""The worker cluster's CPU per turn: the tasks Trellis hands django-q2 name
their function by a ``TaskPath``, which django-q2's worker calls as it is instead of looking the
string up with ``pydoc.locate`` for every task — while the task still pickles, logs and compares
as its dotted path."""

import pickle
import pydoc

from django_q.utils import get_func_repr

from collab.services.admission import RUN_TURN
from collab.services.naming import NAME_BRANCH
from collab.services.webhooks import DELIVER_WEBHOOK
from collab.infra.task_paths import TaskPath


def test_a_task_path_is_the_path_and_runs_the_function_it_names(monkeypatch):
    import collab.tasks

    for task, name in ((RUN_TURN, "run_turn"), (NAME_BRANCH, "name_branch"), (DELIVER_WEBHOOK, "deliver_webhook")):
        assert task == f"collab.tasks.{name}" and callable(task)  # django-q2 calls a callable as it is
        assert get_func_repr(task) == f"collab.tasks.{name}"  # its log lines and saved failures
        copy = pickle.loads(pickle.dumps(task))  # as the broker carries it
        assert type(copy) is TaskPath and copy == task

    called = []
    monkeypatch.setattr(collab.tasks, "run_turn", lambda *args, **kwargs: called.append((args, kwargs)) or "ran")
    monkeypatch.setattr(pydoc, "locate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("looked up")))
    fresh = TaskPath("collab.tasks.run_turn")
    assert fresh("job-1", x=2) == "ran" and called == [(("job-1",), {"x": 2})]

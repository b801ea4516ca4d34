"""How the pages tell branches apart: a branch's name, and where two branches of a session share
one, the name of the branch each forked from ("fix (from main)") — or, when that still does not
tell them apart, a short id ("fix #3f2a1c"). One rule for the graph and the branch list."""

from collections import Counter
from collections.abc import Iterable

SHORT_ID = 6


def branch_labels(branches: Iterable[tuple[str, str, str | None]]) -> dict[str, str]:
    """``(id, name, parent id)`` of every branch of a session (the parent: the branch it forked
    from in this session, or None) -> the label each is shown under."""
    rows = list(branches)
    names = {pk: name for pk, name, _ in rows}
    counts = Counter(names.values())
    labels = {}
    for pk, name, parent in rows:
        if counts[name] < 2:
            labels[pk] = name
        elif parent in names and names[parent] != name:
            labels[pk] = f"{name} (from {names[parent]})"
        else:
            labels[pk] = f"{name} #{pk[:SHORT_ID]}"
    taken = Counter(labels.values())  # two forks of one parent under one name: the short id decides
    for pk, name, _ in rows:
        if taken[labels[pk]] > 1:
            labels[pk] = f"{name} #{pk[:SHORT_ID]}"
    return labels

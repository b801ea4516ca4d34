"""No arrow hidden in a function.

``lint-imports`` ([tool.importlinter] in pyproject.toml) checks which layer may import which,
imports inside functions included. What it cannot see is an import moved into a function only to
hide a cycle. An import stays in a function for a reason: it loads an optional or slow SDK
(``lazy: …``), breaks a genuine cycle at start-up (``cycle: …``), or waits for the app registry
(``app registry: …``). The reason is a comment on the import's own line, or on the line just
above it (above the first of a run of consecutive imports); a bare ``# noqa`` is not a reason.
"""

import ast
import io
import re
import tokenize

from tests.conftest import ROOT

PACKAGES = ("collab", "accounts", "config")
PRAGMA = re.compile(r"#\s*(noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|type:.*|pragma:.*)?\s*$")


def reasons_by_line(source: str) -> set[int]:
    """Lines that carry a comment saying something (not only a noqa/type/pragma marker)."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not PRAGMA.fullmatch(token.string):
            lines.add(token.start[0])
    return lines


def unexplained_imports(source: str) -> list[int]:
    """Line numbers of the imports inside a function or method body that give no reason."""
    reasons = reasons_by_line(source)
    found = []

    def visit(node, in_function: bool):
        for field in ("body", "orelse", "finalbody", "handlers"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list):
                continue
            run_start = None  # the first import of the run of consecutive imports this one is in
            for statement in statements:
                if isinstance(statement, (ast.Import, ast.ImportFrom)):
                    run_start = run_start or statement
                    own_lines = range(statement.lineno, statement.end_lineno + 1)
                    if in_function and run_start.lineno - 1 not in reasons and not reasons.intersection(own_lines):
                        found.append(statement.lineno)
                else:
                    run_start = None
                visit(statement, in_function or isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(source), False)
    return found


def project_modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.relative_to(ROOT).parts:
                yield path


def test_every_function_level_import_says_why_it_is_not_at_module_level():
    offenders = []
    for path in project_modules():
        source = path.read_text()
        lines = source.splitlines()
        offenders += [f"{path.relative_to(ROOT)}:{n}: {lines[n - 1].strip()}" for n in unexplained_imports(source)]
    assert not offenders, (
        "move these imports to module level, or say on the line above why they cannot be "
        "(lazy: an optional or slow SDK / cycle: <module> imports this one / app registry: …):\n"
        + "\n".join(offenders)
    )


def test_the_check_tells_an_explained_import_from_one_that_hides_an_arrow():
    source = '''
import os


def explained():
    # cycle: collab.services.deliver imports this module
    from collab.services.deliver import do_delegate
    from collab.services.deliver import do_send_message
    try:
        import llama_cpp  # lazy: the optional [local] extra
    except ImportError:
        pass


def hidden():
    from collab.services.followup import deliver_owed  # noqa: F401


class Shape:
    def method(self):
        if True:
            import json

            return json
'''
    lines = source.splitlines()
    assert [lines[n - 1].strip() for n in unexplained_imports(source)] == [
        "from collab.services.followup import deliver_owed  # noqa: F401",
        "import json",
    ]


def test_the_check_reads_the_whole_project():
    paths = {path.relative_to(ROOT).as_posix() for path in project_modules()}
    assert {"collab/services/watch.py", "accounts/models.py", "config/settings.py"} <= paths
    assert not any("/migrations/" in path for path in paths)

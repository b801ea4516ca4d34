"""The explorer workspace (docs/contract.md#the-openwork-toolset): confined file tools and bash under
bubblewrap, on real files and a real bwrap. The same tools through real explorer turns are in
test_openwork.py (test_explorer_reads_and_runs_git_but_cannot_write_the_workspace)."""

import os
import shutil
import socket
import uuid

import pytest

from collab import sandbox as sb
from collab.sandbox import run_bash
from collab.workspace import MAX_OUTPUT_CHARS, MAX_READ_BYTES, Workspace, WorkspaceError, open_workspace
from tests.conftest import make_git_repo


@pytest.fixture
def tree(tmp_path):
    """A workspace ``ws`` with a few files, next to an ``outside`` directory holding a secret."""
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 'Hello'\n")
    (root / "src" / "pkg" / "util.py").write_text("def helper():\n    return 'hello'\n")
    (root / "README.md").write_text("# Demo\nhello world\n")
    (root / ".git").mkdir()
    (root / ".git" / "config.py").write_text("hello = 'from .git'\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("hello secret\n")
    (outside / "secret.py").write_text("hello = 'secret'\n")
    return Workspace(root)


def error_code(call, *args, **kwargs):
    with pytest.raises(WorkspaceError) as caught:
        call(*args, **kwargs)
    return caught.value.code


# --- opening and resolving ------------------------------------------------------


def test_it_stores_the_real_path_of_the_root(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert Workspace(tmp_path / "alias").root == (tmp_path / "real").resolve()


def test_it_refuses_a_missing_root(tmp_path):
    assert error_code(Workspace, tmp_path / "nope") == "workspace_unavailable"
    (tmp_path / "file").write_text("x")
    assert error_code(Workspace, tmp_path / "file") == "workspace_unavailable"


def test_open_workspace_returns_none_without_a_root(tmp_path):
    assert open_workspace(None) is None
    assert open_workspace("") is None
    assert open_workspace(str(tmp_path)).root == tmp_path.resolve()


def test_it_resolves_relative_and_absolute_paths_inside_the_root(tree):
    assert tree.resolve("") == tree.root
    assert tree.resolve(".") == tree.root
    assert tree.resolve("src/app.py") == tree.root / "src" / "app.py"
    assert tree.resolve(str(tree.root / "README.md")) == tree.root / "README.md"
    assert tree.resolve("src/../README.md") == tree.root / "README.md"


def test_it_refuses_paths_escaping_the_root(tree):
    assert error_code(tree.resolve, "../outside/secret.txt") == "path_outside_workspace"
    assert error_code(tree.resolve, "..") == "path_outside_workspace"
    assert error_code(tree.resolve, "/etc/passwd") == "path_outside_workspace"
    assert error_code(tree.resolve, str(tree.root.parent / "outside")) == "path_outside_workspace"


def test_it_refuses_symlinks_pointing_outside(tree):
    (tree.root / "leak.txt").symlink_to(tree.root.parent / "outside" / "secret.txt")
    (tree.root / "leakdir").symlink_to(tree.root.parent / "outside")
    assert error_code(tree.resolve, "leak.txt") == "path_outside_workspace"
    assert error_code(tree.resolve, "leakdir") == "path_outside_workspace"
    assert error_code(tree.resolve, "leakdir/secret.txt") == "path_outside_workspace"
    assert error_code(tree.read, "leak.txt") == "path_outside_workspace"


def test_it_accepts_a_symlink_staying_inside(tree):
    (tree.root / "app-link.py").symlink_to("src/app.py")
    assert tree.resolve("app-link.py") == tree.root / "src" / "app.py"
    assert "import os" in tree.read("app-link.py")


def test_it_refuses_nul_bytes(tree):
    assert error_code(tree.resolve, "src\0/app.py") == "invalid_path"


# --- read -----------------------------------------------------------------------


def test_read_numbers_lines_like_cat(tree):
    assert tree.read("src/app.py") == (
        "     1\timport os\n     2\t\n     3\tdef main():\n     4\t    return 'Hello'\n(lines 1–4 of 4)"
    )


def test_read_honours_offset_and_limit(tree):
    (tree.root / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 101)))
    assert tree.read("long.txt", offset=10, limit=3) == "    10\tline 10\n    11\tline 11\n    12\tline 12\n(lines 10–12 of 100)"
    assert tree.read("long.txt", offset=99) == "    99\tline 99\n   100\tline 100\n(lines 99–100 of 100)"
    assert "past the end" in tree.read("long.txt", offset=101)
    assert error_code(tree.read, "long.txt", offset=0) == "invalid_arguments"


def test_read_truncates_long_lines_and_bounds_the_output(tree):
    (tree.root / "wide.txt").write_text("x" * 5000 + "\n")
    assert len(tree.read("wide.txt").splitlines()[0]) < 2100
    (tree.root / "big.txt").write_text(("y" * 1000 + "\n") * 100)
    out = tree.read("big.txt")
    assert len(out) <= MAX_OUTPUT_CHARS + 100
    assert "[… truncated: use offset/limit]" in out
    assert out.endswith("of 100)") and "(lines 1–" in out


def test_read_refuses_binary_large_missing_and_directories(tree):
    (tree.root / "blob.bin").write_bytes(b"\x7fELF\0\0\x01")
    with open(tree.root / "huge.txt", "wb") as sparse:
        sparse.truncate(MAX_READ_BYTES + 1)
    assert error_code(tree.read, "blob.bin") == "binary_file"
    assert error_code(tree.read, "huge.txt") == "file_too_large"
    assert error_code(tree.read, "missing.txt") == "not_found"
    assert error_code(tree.read, "src") == "is_a_directory"


# --- list -----------------------------------------------------------------------


def test_list_shows_sorted_entries_dirs_and_symlinks(tree):
    (tree.root / "outlink").symlink_to(tree.root.parent / "outside")
    assert tree.list() == f".git/\nREADME.md\noutlink -> {tree.root.parent / 'outside'}\nsrc/"
    assert tree.list("src") == "app.py\npkg/"


def test_list_caps_entries(tree):
    many = tree.root / "many"
    many.mkdir()
    for n in range(1005):
        (many / f"f{n:04}").touch()
    out = tree.list("many").splitlines()
    assert len(out) == 1001
    assert out[-1] == "[… 5 more]"


def test_list_refuses_files_and_missing_dirs(tree):
    assert error_code(tree.list, "README.md") == "not_a_directory"
    assert error_code(tree.list, "nope") == "not_found"
    assert error_code(tree.list, "..") == "path_outside_workspace"


# --- glob -----------------------------------------------------------------------


def test_glob_finds_files_relative_to_the_root_outside_git(tree):
    assert tree.glob("**/*.py") == "src/app.py\nsrc/pkg/util.py"
    assert tree.glob("*.py", path="src/pkg") == "src/pkg/util.py"
    assert tree.glob("**/*.rs") == "no files match"


def test_glob_skips_escaping_symlinks(tree):
    (tree.root / "outlink").symlink_to(tree.root.parent / "outside")
    (tree.root / "src" / "secret.py").symlink_to(tree.root.parent / "outside" / "secret.py")
    assert tree.glob("outlink/*") == "no files match"
    assert tree.glob("**/*.py") == "src/app.py\nsrc/pkg/util.py"


def test_glob_caps_results(tree):
    for n in range(510):
        (tree.root / f"f{n:03}.txt").touch()
    out = tree.glob("*.txt").splitlines()
    assert len(out) == 501
    assert out[-1] == "[… 10 more]"


def test_glob_refuses_absolute_and_parent_patterns(tree):
    assert error_code(tree.glob, "/etc/*") == "invalid_pattern"
    assert error_code(tree.glob, "../outside/*") == "invalid_pattern"
    assert error_code(tree.glob, "src/../../*") == "invalid_pattern"
    assert error_code(tree.glob, "") == "invalid_pattern"


# --- grep -----------------------------------------------------------------------


def test_grep_reports_path_line_and_text(tree):
    assert tree.grep("hello") == "README.md:2: hello world\nsrc/pkg/util.py:2:     return 'hello'"
    assert tree.grep("hello", ignore_case=True).count("\n") == 2
    assert tree.grep("hello", glob="*.py", ignore_case=True) == (
        "src/app.py:4:     return 'Hello'\nsrc/pkg/util.py:2:     return 'hello'"
    )
    assert tree.grep("hello", path="src/pkg") == "src/pkg/util.py:2:     return 'hello'"
    assert tree.grep("hello", path="README.md") == "README.md:2: hello world"
    assert tree.grep("nothing-like-this") == "no matches"


def test_grep_skips_binary_files_and_escaping_symlinks(tree):
    (tree.root / "blob.bin").write_bytes(b"hello\0binary")
    (tree.root / "secret.txt").symlink_to(tree.root.parent / "outside" / "secret.txt")
    (tree.root / "outlink").symlink_to(tree.root.parent / "outside")
    out = tree.grep("hello")
    assert "secret" not in out and "blob" not in out and ".git" not in out


def test_grep_caps_matches_and_line_length(tree):
    (tree.root / "many.txt").write_text(("match " + "z" * 1000 + "\n") * 1500)
    out = tree.grep("match", max_matches=5).splitlines()
    assert len(out) == 6
    assert out[-1] == "[… 1495 more]"
    assert all(len(line) <= len("many.txt:1: ") + 500 + 5 for line in out[:-1])
    bounded = tree.grep("match", max_matches=1000).splitlines()
    assert len("\n".join(bounded)) <= MAX_OUTPUT_CHARS + 20
    assert bounded[-1] == f"[… {1500 - (len(bounded) - 1)} more]"


def test_grep_caps_max_matches_at_a_thousand(tree):
    (tree.root / "short.txt").write_text("m\n" * 1500)
    out = tree.grep("m", path="short.txt", max_matches=5000).splitlines()
    assert len(out) == 1001
    assert out[-1] == "[… 500 more]"


def test_grep_refuses_invalid_regex(tree):
    with pytest.raises(WorkspaceError) as caught:
        tree.grep("(unclosed")
    assert caught.value.code == "invalid_pattern"
    assert "missing )" in caught.value.detail


# --- bash under bubblewrap --------------------------------------------------------


@pytest.fixture
def repo(tmp_path):
    """A real git repository as the workspace, with a secret directory beside it."""
    (tmp_path / "sibling").mkdir()
    (tmp_path / "sibling" / "secret.txt").write_text("sibling secret\n")
    return Workspace(make_git_repo(tmp_path / "repo", "hello\n", "first commit"))


@pytest.fixture
def fresh_probe():
    sb._probe.cache_clear()
    yield
    sb._probe.cache_clear()


def test_the_sandbox_is_available_here():
    assert sb.sandbox_status() == (True, "")


def test_bash_runs_git_in_the_workspace(repo):
    result = run_bash(repo, "git log --oneline && pwd && cat hello.txt")
    assert result.exit_code == 0, result.output
    assert "first commit" in result.output
    assert str(repo.root) in result.output
    assert result.as_text().startswith("exit code 0\n")


def test_bash_cannot_write_to_the_workspace(repo):
    result = run_bash(repo, "echo x > created.txt")
    assert result.exit_code != 0
    assert "Read-only file system" in result.output
    assert not (repo.root / "created.txt").exists()


def test_bash_has_a_private_writable_tmp(repo):
    name = f"/tmp/trellis-probe-{uuid.uuid4().hex}"
    result = run_bash(repo, f"echo scratch > {name} && cat {name}")
    assert result.exit_code == 0
    assert result.output == "scratch\n"
    assert not os.path.exists(name)


def test_bash_does_not_inherit_the_environment(repo, monkeypatch):
    monkeypatch.setenv("TRELLIS_SECRET_PROBE", "s3cret")
    result = run_bash(repo, "env")
    assert result.exit_code == 0
    assert "PATH=/usr/bin:/bin" in result.output
    assert "TRELLIS_SECRET_PROBE" not in result.output and "s3cret" not in result.output


def test_bash_has_no_network(repo):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable from outside the sandbox
        result = run_bash(repo, f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected")
    assert result.exit_code != 0
    assert "connected" not in result.output.replace("Connection refused", "")


def test_bash_cannot_read_outside_the_workspace(repo):
    sibling = repo.root.parent / "sibling" / "secret.txt"
    result = run_bash(repo, f"cat {sibling}; cat {__file__}; ls /work /root /var")
    assert result.exit_code != 0
    assert "sibling secret" not in result.output
    assert "bubblewrap" not in result.output  # this file's own text
    assert result.output.count("No such file or directory") == 5


def test_bash_has_no_capabilities(repo):
    result = run_bash(repo, "grep CapEff /proc/self/status")
    assert result.output.split() == ["CapEff:", "0000000000000000"]


def test_bash_timeout_kills_the_sandbox(repo):
    # the sandbox's sleep outlasts the test's own timeout (pyproject: 180 s): run_bash returns
    # only because the sandbox was killed, never because the sleep ended
    result = run_bash(repo, "echo started; sleep 600", timeout_ms=1000)
    assert result.timed_out and result.exit_code is None
    assert result.output == "started\n"
    assert result.as_text() == "timed out after 1000 ms\nstarted\n"


def test_bash_caps_the_output_keeping_head_and_tail(repo):
    result = run_bash(repo, "echo first; yes | head -c 200000; echo last")
    assert result.exit_code == 0
    assert len(result.output) <= MAX_OUTPUT_CHARS
    assert result.output.startswith("first\n")
    assert result.output.endswith("y\nlast\n")
    assert "characters omitted …]" in result.output


def test_bash_refuses_out_of_range_timeouts(repo):
    assert error_code(run_bash, repo, "true", timeout_ms=999) == "invalid_arguments"
    assert error_code(run_bash, repo, "true", timeout_ms=600_001) == "invalid_arguments"


def test_bash_is_never_run_without_the_sandbox(repo, monkeypatch, fresh_probe):
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    assert sb.sandbox_status() == (False, "bubblewrap is not installed (no bwrap on PATH)")
    with pytest.raises(WorkspaceError) as caught:
        run_bash(repo, "touch ran-unsandboxed")
    assert caught.value.code == "sandbox_unavailable"
    assert "not installed" in caught.value.detail
    assert not (repo.root / "ran-unsandboxed").exists()

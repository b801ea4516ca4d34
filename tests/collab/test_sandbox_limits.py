"""The explorers' ``bash`` is a sandbox (docs/contract.md#the-openwork-toolset). Through the tool gateway, on a
real bubblewrap: a fork bomb, a memory hog and an endless loop each end with a clear error and
leave nothing running; the command sees only what it needs of ``/usr`` and none of Trellis's own
files; a workspace that is ``/``, a file, or holds or lies in Trellis's files is refused by
``manage.py workspace``, the admin and the service alike."""

import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from accounts.models import Project
from collab.models import Event
from collab import sandbox as ws
from tests.conftest import make_git_repo


@pytest.fixture
def repo(tmp_path):
    return make_git_repo(tmp_path / "repo", "hello\n", "first commit")


@pytest.fixture
def bash_as(team, scripted_session, repo):
    """``bash(command, timeout_ms=…)`` through the gateway as an OpenWork root branch of a project
    whose workspace is a real git checkout."""
    call_command("workspace", "alpha", str(repo), stdout=io.StringIO())
    api, sid = scripted_session(team.member, [], agent_id="ow", toolset="openwork")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"

    def bash(command, timeout_ms=30_000):
        r = api.post(f"/api/branches/{address}/tools/bash", {"arguments": {"command": command, "timeout_ms": timeout_ms}})
        assert r.status_code == 200, r.content
        return r.json()

    return bash


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line holds ``marker`` (zombies have none and do not count)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                    if marker.encode() in cmdline.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_host_unharmed(marker: str) -> None:
    assert processes_mentioning(marker) == []
    assert subprocess.run(["/bin/true"]).returncode == 0  # this process can still fork


def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing_behind(bash_as):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    result = bash_as(f"{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 4", timeout_ms=8000)
    assert result["is_error"] and result["details"]["process_limit_hit"], result
    assert f"the process limit ({ws.MAX_PROCESSES}) was reached" in result["text"].splitlines()[0]
    assert "Resource temporarily unavailable" in result["text"], result["text"][:2000]
    assert_host_unharmed(marker)


def test_a_memory_hog_fails_at_the_address_space_limit(bash_as):
    marker = f"hog{uuid.uuid4().hex[:8]}"
    result = bash_as(f"python3 -c 'bytearray(8 << 30)  # {marker}'")
    assert result["is_error"] and result["details"]["exit_code"] == 1, result
    assert "MemoryError" in result["text"]
    assert_host_unharmed(marker)


def test_an_endless_loop_is_killed_at_the_timeout_or_the_cpu_limit(bash_as):
    marker = f"loop{uuid.uuid4().hex[:8]}"
    result = bash_as(f"# {marker}\nwhile :; do :; done", timeout_ms=2000)
    assert result["is_error"] and result["details"] == {"exit_code": None, "timed_out": True, "process_limit_hit": False}, result
    assert result["text"].startswith("timed out after 2000 ms")
    assert_host_unharmed(marker)

    # the CPU limit is a hard ceiling under any timeout: a command that spins past it is killed
    # (here it lowers its own soft limit to 1 s, as it may; the sandbox's own is CPU_SECONDS)
    result = bash_as(f"# {marker}\nulimit -S -t 1; while :; do :; done", timeout_ms=30_000)
    assert result["is_error"] and result["details"]["timed_out"] is False, result
    assert result["text"].startswith("exit code 152 (killed: CPU time limit reached")
    assert_host_unharmed(marker)


def test_the_limits_are_set_inside_the_sandbox(bash_as):
    beyond = ws.tmp_bytes() // (1024 * 1024) + 10
    result = bash_as("ulimit -t; ulimit -v; ulimit -f; ulimit -n; ulimit -c; "
                     f"head -c {beyond}M /dev/zero > /tmp/big; echo wrote=$?")
    lines = result["text"].splitlines()
    assert lines[1:6] == [str(ws.CPU_SECONDS), str(ws.MEMORY_BYTES // 1024), str(ws.tmp_bytes() // 1024),
                          str(ws.OPEN_FILES), "0"], lines
    assert "wrote=0" not in result["text"]  # a file beyond the size limit cannot be written


def test_a_command_can_write_only_its_sized_tmp_and_shm(bash_as):
    """The root and /dev are read-only once the sandbox is set up; /tmp and /dev/shm are tmpfs
    of fixed sizes (memory no process limit counts), together the operator's ceiling
    (``TRELLIS_SANDBOX_MEMORY_MB``): a command cannot fill the host's memory through them."""
    shm_mib = ws.shm_bytes() // (1024 * 1024)
    result = bash_as("touch /newfile 2>&1; touch /dev/newfile 2>&1; mkdir /usr/x 2>&1; echo ok > /dev/null && echo null=ok; "
                     f"head -c {shm_mib + 10}M /dev/zero > /dev/shm/fill 2>/dev/null; echo shm=$?; "
                     "du -m /dev/shm/fill | cut -f1; echo x > /tmp/small && echo tmp=ok")
    text = result["text"]
    assert text.count("Read-only file system") == 3, text
    assert "null=ok" in text and "tmp=ok" in text, text
    assert "shm=0" not in text, text  # the write stopped at the tmpfs's size
    sizes = [int(line) for line in text.splitlines() if line.strip().isdigit()]
    assert sizes and sizes[-1] <= shm_mib, text
    assert ws.tmp_bytes() + ws.shm_bytes() == settings.TRELLIS_SANDBOX_MEMORY_MB * 1024 * 1024


def test_bash_sees_the_needed_parts_of_usr_and_none_of_trellis(bash_as):
    own = [str(settings.BASE_DIR / "config" / "settings.py"), str(settings.VAR_DIR), str(Path(sys.prefix) / "bin")]
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        own.append(str(db["NAME"]))
    result = bash_as("git log --oneline; ls /usr; " + "; ".join(f"ls -d {path}" for path in own))
    text = result["text"]
    assert "first commit" in text
    listed = set(text.split("\n", 2)[2].split("\n"))
    assert {"bin", "lib", "share"} <= listed and not {"local", "src", "include"} & listed, text
    assert text.count("No such file or directory") == len(own), text


def test_trellis_files_under_a_bound_system_directory_are_hidden(bash_as, settings):
    """A deployment whose data directory lies under a directory the sandbox binds (here /usr/share/doc
    stands for it) still never shows it: an empty directory covers it."""
    assert any(Path("/usr/share/doc").iterdir())
    settings.VAR_DIR = Path("/usr/share/doc")
    result = bash_as("ls -A /usr/share/doc | wc -l; ls /usr/share | grep -c .")
    count, others = result["text"].splitlines()[1:3]
    assert count == "0" and int(others) > 1, result["text"]


# --- which directories may be a workspace -------------------------------------------------------


def refused_paths(tmp_path) -> dict[str, str]:
    (tmp_path / "file.txt").write_text("x")
    (settings.VAR_DIR / "inside").mkdir(exist_ok=True)
    return {
        "root": "/",
        "file": str(tmp_path / "file.txt"),
        "missing": str(tmp_path / "nope"),
        "data_dir": str(settings.VAR_DIR),
        "inside_data_dir": str(settings.VAR_DIR / "inside"),
        "holding_the_code": str(settings.BASE_DIR.parent),
        "the_code": str(settings.BASE_DIR / "collab"),
    }


def test_manage_py_workspace_refuses_root_files_and_trellis_own_directories(team, tmp_path, repo):
    for case, path in refused_paths(tmp_path).items():
        with pytest.raises(CommandError):
            call_command("workspace", "alpha", path, stdout=io.StringIO())
        assert Project.objects.get(slug="alpha").workspace == "", case
    out = io.StringIO()
    call_command("workspace", "alpha", str(repo), stdout=out)
    assert f"workspace = {repo}" in out.getvalue()
    changed = Event.objects.filter(project=team.alpha, type="workspace.changed")
    assert [e.payload["to"] for e in changed] == [str(repo)]


def test_the_admin_refuses_the_same_workspaces_and_audits_a_good_one(team, tmp_path, repo, client, django_user_model):
    staff = django_user_model.objects.create_superuser("operator", "op@example.com", "pw-secret-123")
    client.force_login(staff)
    url = f"/admin/accounts/project/{team.alpha.pk}/change/"
    form = {"slug": "alpha", "name": "Alpha", "created_at_0": "2026-01-01", "created_at_1": "00:00:00",
            "max_spawn_depth": 1, "max_messages": 8, "max_spawn_fanout": 8, "max_active_turns": 3,
            "watch_policy": "off", "artifact_retention_days": 30, "last_event_seq": 0,
            "memberships-TOTAL_FORMS": 0, "memberships-INITIAL_FORMS": 0}
    for case, path in refused_paths(tmp_path).items():
        r = client.post(url, {**form, "workspace": path})
        assert r.status_code == 200 and "errorlist" in r.content.decode(), case
        assert Project.objects.get(slug="alpha").workspace == "", case
    r = client.post(url, {**form, "workspace": str(repo)})
    assert r.status_code == 302, r.content.decode()[:3000]
    assert Project.objects.get(slug="alpha").workspace == str(repo)
    event = Event.objects.get(project=team.alpha, type="workspace.changed")
    assert event.payload == {"from": "", "to": str(repo)} and event.actor == staff


def test_a_workspace_set_before_the_rule_is_not_served(team, scripted_session):
    """A project row that already names a refused directory gets no workspace tools answers."""
    Project.objects.filter(pk=team.alpha.pk).update(workspace=str(settings.BASE_DIR))
    api, sid = scripted_session(team.member, [], agent_id="ow", toolset="openwork")
    assert api.post(f"/api/sessions/{sid}/turns", {"prompt": "go"}).status_code == 202
    address = f"{sid}:{api.get(f'/api/sessions/{sid}').json()['head']}"
    body = api.post(f"/api/branches/{address}/tools/read", {"arguments": {"path": "config/settings.py"}}).json()
    assert body["is_error"] and body["details"]["code"] == "workspace_unavailable", body

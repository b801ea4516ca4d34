"""A chat front end on LangGraph's own ``useStream`` (``@langchain/langgraph-sdk/react``, pinned
in ``tests/browser/chat_ui/package.json``), built as Agent Chat UI builds its thread view and
served from an origin of its own, works against Trellis's ``/lg`` in real headless Chromium, on
daphne and a worker (docs/langgraph.md#chat-front-ends): it reaches ``/info``, creates a thread,
streams a person's messages and the answers, regenerates an answer (the thread follows the fork
and keeps the old answer), edits the first message, and resumes a run that waits for a person's
approval — all cross-origin
with the token as its API key.

The page is bundled with esbuild from the pinned packages (``npm ci`` from the npm registry the
first time; ``node_modules`` is not committed)."""

import functools
import http.server
import shutil
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

from accounts.models import ApiToken, TokenScope
from collab.models import Branch, Job, PersonAsk
from tests.conftest import api_client_of, make_spec

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("postgres")]  # the client, not the data

APP = Path(__file__).parent / "chat_ui"
LIVE = 30_000  # ms: a run on a busy machine
ECHO = [{"text": "echo: {{prompt}}"}]
CAREFUL = [
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "ship it"}}]},
    {"text": "after the call: {{last.text}}"},
]


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, cwd=APP, capture_output=True, text=True, timeout=600)
    if done.returncode:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


@pytest.fixture(scope="module")
def chat_page(tmp_path_factory):
    """The chat page's origin: ``index.html`` and its bundle, served by a server of their own."""
    if shutil.which("npm") is None:
        pytest.fail("npm is missing: the chat front end is built from the npm registry (apt-get install -y npm)")
    if not (APP / "node_modules" / ".package-lock.json").exists():
        _run(["npm", "ci", "--no-audit", "--no-fund"], "npm ci")
    site = tmp_path_factory.mktemp("chat_ui")
    _run([str(APP / "node_modules" / ".bin" / "esbuild"), "app.jsx", "--bundle", "--minify",
          f"--outfile={site / 'app.js'}", "--define:process.env.NODE_ENV=\"production\"", "--log-level=warning"],
         "esbuild")
    shutil.copy(APP / "index.html", site / "index.html")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def open_chat(page, chat_page, server, user, assistant: str):
    _, raw = ApiToken.issue(user, name="chat front end", scopes=TokenScope.values)  # holds: to resume interrupts
    page.set_default_timeout(LIVE)
    page.goto(f"{chat_page}/?" + urlencode({"api": f"{server.url}/lg", "key": raw, "assistant": assistant}))
    expect(page.locator("#server")).to_have_text("trellis", timeout=LIVE)  # GET /info, cross-origin
    return page


def say(page, text: str) -> None:
    page.fill("#draft", text)
    page.click("#send")


def texts(page) -> list[str]:
    return page.locator("#messages li .text").all_inner_texts()


def test_a_use_stream_chat_page_streams_regenerates_and_resumes_against_lg(team, server, worker, browser,
                                                                          chat_page):
    owner = api_client_of(team.owner)
    make_spec(owner, "echo", ECHO)
    make_spec(owner, "careful", CAREFUL, approvals=["todo_create"])
    page = browser.new_page()
    open_chat(page, chat_page, server, team.member, "echo")
    messages = page.locator("#messages li")

    say(page, "hello")
    expect(messages.nth(1).locator(".text")).to_have_text("echo: hello", timeout=LIVE)
    say(page, "again")
    expect(messages.nth(3).locator(".text")).to_have_text("echo: again", timeout=LIVE)
    expect(page.locator("main")).to_have_attribute("data-loading", "false", timeout=LIVE)
    tid = page.locator("main").get_attribute("data-thread")
    assert texts(page) == ["hello", "echo: hello", "again", "echo: again"]
    assert Branch.objects.filter(session_id=tid).count() == 1  # each message went on from the head
    old_answer = messages.nth(3).get_attribute("data-id")

    messages.nth(3).locator("button.regenerate").click()  # from the checkpoint before the answer
    expect(messages.nth(3)).not_to_have_attribute("data-id", old_answer, timeout=LIVE)
    expect(messages.nth(3).locator(".text")).to_have_text("echo: again", timeout=LIVE)
    expect(page.locator("main")).to_have_attribute("data-loading", "false", timeout=LIVE)
    assert texts(page) == ["hello", "echo: hello", "again", "echo: again"]
    assert Branch.objects.filter(session_id=tid).count() == 2  # a fork, followed; the old answer kept
    assert Job.objects.filter(session_id=tid).count() == 3
    page.fill("#draft", "howdy")  # edit the first message: from the checkpoint before it, the root
    messages.nth(0).locator("button.edit").click()
    expect(messages.nth(0).locator(".text")).to_have_text("howdy", timeout=LIVE)
    expect(messages.nth(1).locator(".text")).to_have_text("echo: howdy", timeout=LIVE)
    expect(page.locator("main")).to_have_attribute("data-loading", "false", timeout=LIVE)
    assert texts(page) == ["howdy", "echo: howdy"]
    assert Branch.objects.filter(session_id=tid, forked_from__isnull=True).count() == 2  # a new root
    assert not page.locator("#error").count()
    assert page.locator("main").get_attribute("data-custom") == "0"  # a Trellis agent writes no custom event

    careful = browser.new_page()
    open_chat(careful, chat_page, server, team.member, "careful")
    say(careful, "ship")
    expect(careful.locator("#approve")).to_be_visible(timeout=LIVE)  # the run waits for a person: an interrupt
    tid = careful.locator("main").get_attribute("data-thread")
    assert PersonAsk.objects.get(job__session_id=tid).status == "pending"
    careful.click("#approve")
    expect(careful.locator("#messages li").last).to_contain_text("after the call:", timeout=LIVE)
    assert PersonAsk.objects.get(job__session_id=tid).status == "approved"
    assert not careful.locator("#error").count()

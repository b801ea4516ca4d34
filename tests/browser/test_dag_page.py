"""The session DAG in real Chromium: a scripted session with a fork (then
archived), a background spawn with its result, and a delegation with its result, run by a real
worker; the page's SVG has the right lanes, dots and edges, new rows arrive live, a node opens
its branch, and the picture is saved for the README (docs/session-dag.png)."""

import os
import threading
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.browser.test_session_page import log_in
from tests.conftest import settle_session

pytestmark = [pytest.mark.slow, pytest.mark.browser]

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The README's picture is taken again only when asked (TRELLIS_UPDATE_DOCS=1): a test run leaves
# the work tree as it found it.
UPDATE_DOCS = os.environ.get("TRELLIS_UPDATE_DOCS") == "1"

SCRIPT = {
    "user": [{"text": "Let us ask a scout to look around."}],
    "spawn": [{"text": "scout report: three packages"}],
    "task": [{"text": "checked: the tests pass"}],
    "followup": [{"text": "noted the result"}],
}


def off_loop(fn, *args, **kwargs):
    """Run ``fn`` in a thread of its own: once Playwright's event loop runs on this thread, the
    event push that follows a commit (``async_to_sync``) must not run here."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args, **kwargs)))
    thread.start()
    thread.join(60)
    assert out, "the call did not finish"
    return out[0]


def test_the_dag_of_a_scripted_session_has_its_lanes_dots_and_edges(team, scripted_session, server,
                                                                                    worker, request, tmp_path):
    from collab.gateway import run_as_branch
    from collab.models import Branch, Job, Message, Session
    from collab.services.turns import do_fork_and_start

    api, sid = scripted_session(team.member, SCRIPT)
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "Plan the work"})
    assert r.status_code == 202, r.content
    settle_session(api, sid)
    main = Branch.objects.get(session_id=sid, name="main")
    run_as_branch(team.member, main.address, "agent", {"prompt": "Scout the repository layout", "description": "scout",
                                                       "run_in_background": True})
    settle_session(api, sid)  # the background scout, and the follow-up with its result
    scout = Branch.objects.get(session_id=sid, name="scout")
    first_prompt = Message.objects.filter(branch=main).order_by("created_at").first()
    fork_job = do_fork_and_start(team.member, Session.objects.get(pk=sid), first_prompt, "Try another plan")
    settle_session(api, sid)
    run_as_branch(team.member, Branch.objects.get(pk=main.pk).address, "agent",
                  {"to": Branch.objects.get(pk=scout.pk).address, "prompt": "Run the tests"})
    settle_session(api, sid)  # the delegated task on the scout, and its result back on main
    r = api.post(f"/api/branches/{Branch.objects.get(pk=fork_job.branch_id).address}/archive", {"reason": "dead end"})
    assert r.status_code == 200, r.content

    rows = list(Message.objects.filter(session_id=sid).exclude(kind="attach").order_by("created_at", "id"))
    fork = Branch.objects.get(pk=fork_job.branch_id)
    assert (main.lane, scout.lane, fork.lane) == (0, 1, 2)
    spawn = Job.objects.get(session_id=sid, kind="spawn")
    task = Job.objects.get(session_id=sid, kind="task")
    fork_first = next(m for m in rows if m.branch_id == fork.pk)

    page = request.getfixturevalue("page")  # Playwright starts only now: the setup above pushed its events
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{sid}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    dag = page.locator("#dag svg")
    nodes = dag.locator("[data-node]")
    expect(nodes).to_have_count(len(rows))
    assert nodes.evaluate_all("els => els.map(e => e.dataset.node)") == [m.pk for m in rows]  # oldest on top
    lanes = {m.branch_id: lane for m, lane in zip(rows, nodes.evaluate_all("els => els.map(e => +e.dataset.lane)"))}
    assert lanes == {main.pk: 0, scout.pk: 1, fork.pk: 2}
    ys = nodes.evaluate_all("els => els.map(e => +e.querySelector('circle.dot').getAttribute('cy'))")
    assert ys == sorted(ys) and len(set(ys)) == len(ys)  # one row per message
    # the fork point is a dot with a curve to the new lane
    expect(dag.locator(f'[data-node="{first_prompt.pk}"][data-fork-point]')).to_have_count(1)
    expect(dag.locator(f'path[data-edge="fork"][data-from="{first_prompt.pk}"][data-to="{fork_first.pk}"]')).to_have_count(1)
    # the spawn and the delegation, from the calling node to the child's first node
    expect(dag.locator(f'path[data-edge="spawn"][data-detail="spawn"][data-from="{spawn.caller_msg_id}"]'
                       f'[data-to="{spawn.prompt_msg_id}"]')).to_have_count(1)
    expect(dag.locator(f'path[data-edge="spawn"][data-detail="task"][data-from="{task.caller_msg_id}"]'
                       f'[data-to="{Job.objects.get(pk=task.pk).prompt_msg_id}"]')).to_have_count(1)
    # two results back to main, each from the scout's last row of that job to the follow-up it became
    followups = list(Job.objects.filter(session_id=sid, kind="followup").order_by("created_at"))
    assert len(followups) == 2
    for followup in followups:
        expect(dag.locator(f'path[data-edge="result"][data-to="{followup.prompt_msg_id}"]')).to_have_count(1)
    expect(dag.locator("path[data-edge]")).to_have_count(5)
    # the archived lane is dimmed and says why on hover
    archived = dag.locator(f'line.lane.archived[data-branch="{fork.pk}"]')
    expect(archived).to_have_count(1)
    expect(archived.locator("title")).to_contain_text("archived: dead end")
    assert float(archived.evaluate("e => getComputedStyle(e).opacity")) < 0.5
    expect(dag.locator("[data-live]")).to_have_count(0)

    picture = DOCS / "session-dag.png" if UPDATE_DOCS else tmp_path / "session-dag.png"
    page.goto(f"{server.url}/s/{sid}/?branch={main.pk}")  # the picture for the README reads main
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    page.screenshot(path=str(picture), full_page=False)
    assert picture.stat().st_size > 0
    # the lane of the branch the transcript shows is marked (and only that one)
    shown = dag.locator("line.lane.shown")
    expect(shown).not_to_have_count(0)  # (a vertical line has no width: Playwright never calls it "visible")
    assert set(shown.evaluate_all("els => els.map(e => e.dataset.branch)")) == {main.pk}

    # a new turn's rows arrive live, appended below (rows above keep their place)
    before = dag.locator("[data-node] circle.dot").evaluate_all("els => els.map(e => e.getAttribute('cy'))")
    r = off_loop(api.post, f"/api/sessions/{sid}/turns", {"prompt": "One more thing", "branch": "scout"})
    assert r.status_code == 202, r.content
    expect(page.locator("#dag svg [data-node]")).to_have_count(len(rows) + 2, timeout=20_000)
    after = page.locator("#dag svg [data-node] circle.dot").evaluate_all("els => els.map(e => e.getAttribute('cy'))")
    assert after[: len(before)] == before

    # replay: as of event N the graph holds the rows written by then; read-only
    from collab.events import with_full_payloads
    from collab.models import Event

    # read as every reader of the log does (the rows keep a reference to their message)
    created = [e for e in with_full_payloads(Event.objects.filter(session_id=sid, type="message.created").order_by("seq"))
               if e.payload["kind"] != "attach"]  # attach pointers are edges, not rows
    fourth = created[3].seq
    page.goto(f"{server.url}/s/{sid}/?at={fourth}")
    expect(page.locator("#dag .badge")).to_have_text(f"replay · event {fourth}")
    expect(page.locator("#dag svg [data-node]")).to_have_count(4)
    assert page.locator("#dag svg [data-node]").evaluate_all("els => els.map(e => e.dataset.node)") == [
        e.payload["id"] for e in created[:4]]
    expect(page.locator("#dag-live")).to_have_count(0)
    page.locator('#dag a.step[rel="prev"]').click()
    expect(page).to_have_url(f"{server.url}/s/{sid}/?at={fourth - 1}")
    expect(page.locator("#dag svg [data-node]")).to_have_count(3)
    page.goto(f"{server.url}/s/{sid}/")

    # a node opens its branch's reading view at that node
    page.locator(f'#dag [data-node="{fork_first.pk}"]').click()
    expect(page).to_have_url(f"{server.url}/s/{sid}/?branch={fork.pk}&head={fork_first.pk}")
    expect(page.locator("#transcript")).to_contain_text("Try another plan")
    expect(page.locator(f'#dag line.lane.shown[data-branch="{fork.pk}"]')).not_to_have_count(0)
    assert set(page.locator("#dag line.lane.shown").evaluate_all("els => els.map(e => e.dataset.branch)")) == {fork.pk}


def test_a_long_session_opens_on_its_newest_page_and_loads_older_rows_on_scroll(team, server, request):
    """The graph opens with the newest page (scrolled to the bottom); scrolling up
    loads the older pages above it, in order, with no row twice or missing."""
    from collab.models import Message
    from collab.selectors.dag import PAGE_ROWS
    from tests.collab.test_dag_selector import _big_session

    session = _big_session(team, 2 * PAGE_ROWS + 30, 12, title="long")
    expected = list(Message.objects.filter(session=session).order_by("created_at", "id").values_list("pk", flat=True))
    page = request.getfixturevalue("page")
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, server, team.member)
    page.goto(f"{server.url}/s/{session.pk}/")
    nodes = page.locator("#dag [data-node]")
    expect(nodes).to_have_count(PAGE_ROWS)
    scroller = page.locator("#dag .dag-scroll")
    # opened at the bottom: the newest row is in view, the oldest of the page is not
    expect(page.locator(f'#dag [data-node="{expected[-1]}"]')).to_be_in_viewport()
    for shown in (2 * PAGE_ROWS, len(expected)):
        scroller.evaluate("e => { e.scrollTop = -e.scrollHeight; }")  # column-reverse: the top is negative
        expect(nodes).to_have_count(shown)
    assert nodes.evaluate_all("els => els.map(e => e.dataset.node)") == expected
    expect(page.locator("#dag .dag-older")).to_have_count(0)
    folded = page.locator("#dag [data-folded-lanes]")
    expect(folded.first).to_have_text("+4")  # 12 lanes, 8 drawn, the rest folded
    # the label sits above its block's graph: it covers no node
    overlaps = page.evaluate("""() => {
        const boxes = [...document.querySelectorAll('#dag [data-node] circle.dot')].map(d => d.getBoundingClientRect());
        return [...document.querySelectorAll('#dag [data-folded-lanes]')].map(label => label.getBoundingClientRect())
            .filter(l => boxes.some(b => l.left < b.right && b.left < l.right && l.top < b.bottom && b.top < l.bottom)).length;
    }""")
    assert overlaps == 0

"""The home page and the audit log in real headless Chromium against daphne
(docs/web-app.md#the-home-page, docs/web-app.md#audit-and-activity-in-sentences): a turn shows
under "Running now", then, once it has ended and the person comes back, under "Finished since your
last visit"; the audit log tells an archive in a sentence and shows every event behind its toggle."""

import re

import pytest
from playwright.sync_api import expect

from collab.models import Branch
from collab.runtime.loop import run_job
from collab.services.archive import do_archive_branch
from tests.browser.test_session_page import log_in
from tests.conftest import off_the_loop

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("postgres")]  # pages, not data


def test_home_shows_a_turn_running_then_finished_and_the_audit_tells_an_archive(team, scripted_session, server,
                                                                                request):
    # long enough to be seen running if a worker of this test run takes it first
    api, sid = scripted_session(team.maintainer, [{"sleep_ms": 3000}, {"text": "answer"}])
    r = api.post(f"/api/sessions/{sid}/turns", {"prompt": "first"})
    assert r.status_code == 202, r.content
    job = r.json()["execution_id"]  # queued, or running if this run's worker process took it
    page = request.getfixturevalue("page")  # Playwright starts only now: the setup above pushed its events

    log_in(page, server, team.maintainer)  # lands on the home page: the first visit
    running = page.locator(f'#running li[data-job="{job}"]')
    expect(running).to_contain_text(re.compile(r"maintainer asked bot on main in session test — (queued|running) for"))
    expect(page.locator("#finished")).to_contain_text("Nothing finished in the last day.")

    off_the_loop(run_job, job)  # as a worker would (nothing to do if one has it)
    api.wait(job)
    page.goto(f"{server.url}/")
    finished = page.locator(f'#finished li[data-job="{job}"]')
    expect(finished).to_contain_text("succeeded in")
    expect(page.locator("#finished h2")).to_contain_text("Finished since your last visit")
    expect(page.locator("#running")).to_contain_text("Nothing running.")
    expect(finished.locator("a", has_text="main")).to_have_attribute("href", re.compile(rf"^/s/{sid}/\?branch=\w+$"))
    page.reload()
    expect(page.locator("#finished")).to_contain_text("Nothing new since your last visit.")

    branch = Branch.objects.get(session_id=sid, name="main")
    off_the_loop(do_archive_branch, branch, user=team.maintainer, reason="shipped <it>")
    page.goto(f"{server.url}/p/alpha/audit")
    expect(page.locator('tr[data-type="branch.archived"] td.sentence')).to_have_text(
        "maintainer archived branch main in session test: shipped <it>")
    expect(page.locator('tr[data-type="job.succeeded"]')).to_have_count(0)
    page.click("#audit-toggle")
    expect(page).to_have_url(re.compile(r"/p/alpha/audit\?show=all$"))
    expect(page.locator('tr[data-type="job.succeeded"] td.sentence')).to_contain_text("succeeded in")

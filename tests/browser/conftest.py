"""The browser tests' Playwright and Chromium, shared by every module of this package.

Package scope, not session: Playwright's sync API keeps an event loop running on the main
thread while it is open, which would break ``async_to_sync`` in the tests that follow, so it is
closed after the last test of this package (pytest runs a package's tests together). Each test
gets a fresh browser context (``page``, or one of its own): cookies, storage and pages are never
shared between tests, only the Chromium process and the Playwright driver, which cost a few
seconds to start for each module before.
"""

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="package")
def _playwright():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium chromium-driver")
    # While Playwright's driver is open, its (idle) event loop counts as running on this thread,
    # so Django takes the browser test's own synchronous ORM calls — and pytest-django's flush
    # between tests — for ORM use inside async code. Only here is that check off: every other
    # package, and every in-process consumer, stream and async route they drive, runs with it on
    # (the web and worker processes never have it off: process_env).
    before = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as p:
            yield p
    finally:
        if before is None:
            del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = before


@pytest.fixture(scope="package")
def browser(_playwright):
    browser = _playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield browser
    browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()

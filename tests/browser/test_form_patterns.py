"""Every ``pattern`` attribute compiles in Chromium, which reads it as a regular expression with
the ``v`` flag (where ``-`` at the end of a class, and an unescaped ``(``, ``)``, ``[``, ``{``,
``}``, ``/`` or ``|`` in one, is a syntax error): an invalid pattern logs a console error on every
page load and is ignored, so the browser checks nothing."""

import pytest

from tests.browser.test_session_page import log_in

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.one_database("sqlite")]  # layout, not data


def test_the_spec_forms_agent_id_pattern_is_valid_and_checks_the_id(team, server, page):
    console = []
    page.on("console", lambda m: m.type == "error" and console.append(m.text))
    log_in(page, server, team.owner)
    page.goto(f"{server.url}/p/alpha/specs")

    agent_id = page.locator("#spec-form input[name=agent_id]")
    assert agent_id.get_attribute("pattern")
    compiles = page.evaluate("""() => [...document.querySelectorAll('[pattern]')].map(el => {
        try { new RegExp('^(?:' + el.getAttribute('pattern') + ')$', 'v'); return null; }
        catch (e) { return el.name + ': ' + e.message; }
    })""")
    assert [c for c in compiles if c] == []

    def valid(value):
        agent_id.fill(value)
        return agent_id.evaluate("el => el.checkValidity()")

    assert valid("reviewer_2-b")
    assert valid("-_-")
    assert not valid("has space")
    assert not valid("slash/no")
    assert not valid("dot.no")
    assert not [line for line in console if "pattern" in line.lower()], console

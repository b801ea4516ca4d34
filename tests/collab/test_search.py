"""Finding anything (docs/web-app.md#search, docs/api.md#search): messages, branch names and session
titles across the projects a person may see, through ``GET /api/search`` and the search page, on
both databases (the PostgreSQL GIN index and the SQLite FTS5 table of migration collab/0028_search).

Rows are written straight to the tables, as the services write them (the index and the triggers
see every INSERT alike); a private session of ``member`` is the one the ``viewer`` may not see."""

import html
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from collab.models import Branch, Message, MessageKind, Session, Visibility
from collab.selectors.search import CANDIDATES, MAX_QUERIES, search


def session_of(project, user, title, visibility=Visibility.PROJECT):
    return Session.objects.create(project=project, created_by=user, title=title, visibility=visibility)


def say(branch, text="", role="user", after=None, **fields):
    message = Message.objects.create(session_id=branch.session_id, branch=branch, predecessor=after, role=role,
                                     text=text, depth=after.depth + 1 if after else 0, **fields)
    Branch.objects.filter(pk=branch.pk).update(tip=message)
    return message


class World:
    def __init__(self, team):
        self.team = team
        s1 = self.planning = session_of(team.alpha, team.member, "Platypus planning")
        main = self.main = Branch.objects.create(session=s1, name="main")
        self.burrow = say(main, "Where does the platypus sleep? The platypus sleeps in a burrow: platypus facts.")
        self.long = say(main, "A long answer that mentions the platypus once, then goes on about rivers, "
                              + "and rivers, " * 40, role="assistant", after=self.burrow)
        self.call = say(main, role="assistant", after=self.long, tool_calls=[
            {"id": "call_1", "name": "read_file", "arguments": {"path": "docs/quokka-notes.md"}}])
        self.result = say(main, '{"status": "ok", "wombat_count": 3}', role="tool", after=self.call,
                          tool_call_id="call_1", metadata={"tool": "read_file"})
        fork = self.fork = Branch.objects.create(session=s1, name="fix-capybara-login", forked_from=self.burrow)
        self.on_fork = say(fork, "capybara ideas, kept on an archived branch", after=self.burrow)
        Branch.objects.filter(pk=fork.pk).update(archived=True, archived_at=fork.created_at)
        say(main, "spawned 'platypus scout'", role="system", after=self.burrow, kind=MessageKind.ATTACH)
        # the member's private session, and a visible one that quotes it (a result from it)
        s2 = self.secret = session_of(team.alpha, team.member, "Zanzibar secret plans", Visibility.PRIVATE)
        hidden_main = Branch.objects.create(session=s2, name="zanzibar-branch")
        self.vault = say(hidden_main, "the zanzibar vault code is 1234")
        s3 = self.report = session_of(team.alpha, team.member, "Weekly report")
        self.quote = say(Branch.objects.create(session=s3, name="main"),
                         f"[result from {s2.pk}:{self.vault.pk}] Agent 'zanzibar-branch' finished: all done")
        # another tenant's project
        s4 = self.beta = session_of(team.beta, team.outsider, "Platypus in beta")
        self.beta_message = say(Branch.objects.create(session=s4, name="main"), "beta platypus secret")


@pytest.fixture
def world(team):
    return World(team)


def found(api, q, **params):
    r = api.get("/api/search", q=q, **params)
    assert r.status_code == 200, r.content
    return r.json()["results"]


def keys(results):
    return [(r["kind"], r["message"] or r["branch"] or r["session"]) for r in results]


def test_it_finds_titles_then_messages_by_relevance_in_the_viewers_projects_only(world, api_as, team):
    results = found(api_as(team.viewer), "platypus")
    assert keys(results) == [("session", world.planning.pk), ("message", world.burrow.pk),
                             ("message", world.long.pk)]
    title, burrow = results[0], results[1]
    assert title["snippet"] == "<mark>Platypus</mark> planning" and title["branch"] is None
    assert burrow["project"] == "alpha" and burrow["session"] == world.planning.pk
    assert burrow["session_title"] == "Platypus planning" and burrow["branch"] == world.main.pk
    assert burrow["branch_name"] == "main" and burrow["role"] == "user" and not burrow["archived"]
    assert burrow["snippet"].count("<mark>platypus</mark>") == 3
    assert burrow["url"] == f"/s/{world.planning.pk}/?branch={world.main.pk}&head={world.burrow.pk}"
    assert burrow["created_at"]
    # the outsider sees their own project's only; the attach pointer is never a result
    assert keys(found(api_as(team.outsider), "platypus")) == [("session", world.beta.pk),
                                                              ("message", world.beta_message.pk)]
    assert keys(found(api_as(team.member), "platypus", project="alpha"))[:2] == keys(results)[:2]


def test_each_word_matches_words_that_start_with_it_and_every_word_must_match(world, api_as, team):
    api = api_as(team.viewer)
    assert ("message", world.burrow.pk) in keys(found(api, "PLATYP"))
    assert keys(found(api, "platypus burrow")) == [("message", world.burrow.pk)]
    assert keys(found(api, "plat platypus"))[:2] == [("session", world.planning.pk), ("message", world.burrow.pk)]
    assert found(api, "platypus zebra") == []
    assert found(api, "p") == []  # one character matches only itself
    assert found(api, "!!!") == []  # no word to look for: nothing, not an error
    assert found(api, "½") == []  # a word one database reads as none: nothing either


def test_tool_calls_are_searched_by_their_values_and_results_by_their_text(world, api_as, team):
    api = api_as(team.viewer)
    (call,) = found(api, "quokka")
    assert call["message"] == world.call.pk and call["role"] == "assistant"
    assert html.unescape(re.sub("</?mark>", "", call["snippet"])) == 'read_file({"path": "docs/quokka-notes.md"})'
    assert "<mark>quokka</mark>" in call["snippet"]
    assert keys(found(api, "read_file")) == [("message", world.call.pk)]  # the tool's name, not the result's metadata
    assert found(api, "arguments") == []  # the JSON's keys are not words of the message
    assert keys(found(api, "wombat")) == [("message", world.result.pk)]


def test_archived_branches_are_found_and_say_so(world, api_as, team):
    results = found(api_as(team.viewer), "capybara")
    assert keys(results) == [("branch", world.fork.pk), ("message", world.on_fork.pk)]
    assert all(r["archived"] for r in results)
    assert results[0]["snippet"] == "fix-<mark>capybara</mark>-login"
    assert results[0]["url"] == f"/s/{world.planning.pk}/?branch={world.fork.pk}"


def test_a_hidden_session_never_appears_not_even_through_a_visible_message_quoting_it(world, api_as, team,
                                                                                     browser_of):
    assert found(api_as(team.viewer), "zanzibar") == []
    assert found(api_as(team.viewer), "vault") == []
    page = browser_of(team.viewer).get(reverse("collab:search"), {"q": "zanzibar"}).content.decode()
    assert "Nothing matched “zanzibar”." in page and world.secret.pk not in page
    # the visible message is still found by its other words, the hidden session's names blanked
    (quote,) = found(api_as(team.viewer), "finished")
    assert quote["message"] == world.quote.pk and "zanzibar" not in quote["snippet"].lower()
    assert world.secret.pk not in quote["snippet"] and "another session" in quote["snippet"]
    # its creator finds all of it
    assert set(keys(found(api_as(team.member), "zanzibar"))) == {
        ("session", world.secret.pk), ("branch", world.vault.branch_id), ("message", world.vault.pk),
        ("message", world.quote.pk)}
    assert found(api_as(team.outsider), "zanzibar") == []


def test_snippets_are_escaped_html_with_the_matches_marked_around_the_first_match(world, api_as, team):
    say(world.main, "<script>alert('narwhal')</script> & a narwhal", after=world.result)
    (hit,) = found(api_as(team.viewer), "narwhal")
    assert hit["snippet"] == ("&lt;script&gt;alert(&#x27;<mark>narwhal</mark>&#x27;)&lt;/script&gt; &amp; a "
                              "<mark>narwhal</mark>")
    far = say(world.main, "filler words " * 60 + "the okapi is here " + "and more words " * 60, after=world.result)
    (hit,) = found(api_as(team.viewer), "okapi")
    assert hit["message"] == far.pk and "<mark>okapi</mark>" in hit["snippet"]
    assert hit["snippet"].startswith("…") and hit["snippet"].endswith("…") and len(hit["snippet"]) < 260


def test_bad_queries_are_a_400_with_a_reason_and_other_projects_a_404(world, api_as, team, browser_of):
    api = api_as(team.member)
    for params in ({}, {"q": ""}, {"q": "   "}, {"q": "x" * 201}, {"q": "x" * 100_000}):
        r = api.get("/api/search", **params)
        assert r.status_code == 400 and r.json()["code"] == "invalid_query" and r.json()["detail"], (params, r.content)
    for params in ({"q": "platy\x00pus"}, {"q": "platypus", "limit": "9" * 30}, {"q": "platypus", "limit": -3}):
        assert api.get("/api/search", **params).status_code == 200, params
    assert api.get("/api/search?q=platy%ED%A0%80pus").status_code == 200  # a lone surrogate, as UTF-8 bytes
    assert api.get("/api/search", q="platypus", limit="many").status_code == 422
    hidden, missing = api.get("/api/search", q="platypus", project="beta"), api.get("/api/search", q="a", project="no")
    assert hidden.status_code == missing.status_code == 404 and hidden.json() == missing.json()
    assert api.get("/api/search", q="platypus", limit=1).json()["results"][0]["kind"] == "session"
    page = browser_of(team.member)
    assert page.get(reverse("collab:search"), {"q": "x" * 201}).status_code == 400
    assert page.get(reverse("collab:search"), {"q": "platypus", "project": "beta"}).status_code == 404


def test_the_newest_matches_are_the_ones_ranked_whatever_their_age(world, team):
    """The newest ``CANDIDATES`` matches are ranked: on PostgreSQL the search reads the last day's
    first, then wider windows, and the answer is the one of all time."""
    old = say(world.main, "kiwi kiwi kiwi kiwi", after=world.result)
    Message.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    for n in range(10):
        say(world.main, f"a kiwi in a long sentence about fruit number {n}", after=world.result)
    assert search(team.viewer, "kiwi")[0]["message"] == old.pk  # the best of the eleven
    for n in range(CANDIDATES):
        say(world.main, f"another kiwi, plain {n}", after=world.result)
    results = search(team.viewer, "kiwi", limit=50)
    assert len(results) == 50 and old.pk not in {r["message"] for r in results}  # past the newest 200


def test_a_search_costs_the_same_few_queries_however_many_messages_match(world, team):
    def queries(user, q):
        with CaptureQueriesContext(connection) as captured:
            results = search(user, q, limit=50)
        return len(captured), results

    few, _ = queries(team.viewer, "platypus")
    tip = world.result
    for n in range(60):
        tip = say(world.main, f"platypus sighting {n}", after=tip)
    many, results = queries(team.viewer, "platypus")
    assert many == few <= MAX_QUERIES and len(results) == 50
    # texts naming a hidden session cost redaction's few more, however many
    for n in range(30):
        tip = say(world.main, f"okapi sighting {n} near {world.secret.pk}", after=tip)
    named, results = queries(team.viewer, "okapi")
    assert named <= MAX_QUERIES and len(results) == 30
    assert all(world.secret.pk not in r["snippet"] and "another session" in r["snippet"] for r in results)


def test_a_deleted_session_leaves_nothing_to_find(world, api_as, team):
    world.planning.delete()
    assert found(api_as(team.viewer), "platypus") == []
    assert found(api_as(team.viewer), "quokka") == []
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM collab_message_fts WHERE collab_message_fts MATCH 'platypus'")
            assert cursor.fetchone()[0] == 1  # beta's message only


def test_the_pages_say_plainly_what_matched_and_what_did_not(world, browser_of, team):
    page = browser_of(team.viewer)
    body = page.get(reverse("collab:search"), {"q": "platypus"}).content.decode()
    assert "3 results for “platypus”" in body
    assert f'href="/s/{world.planning.pk}/?branch={world.main.pk}&amp;head={world.burrow.pk}"' in body
    assert "<mark>platypus</mark>" in body and "beta platypus" not in body
    assert 'action="/search"' in body  # the header's box
    assert "Nothing matched “okapi zebra”" in page.get(reverse("collab:search"), {"q": "okapi zebra"}).content.decode()
    assert 'id="search-summary"' not in page.get(reverse("collab:search")).content.decode()
    project = page.get(reverse("collab:project", args=["alpha"]), {"q": "okapi"}).content.decode()
    assert "No session’s title or id matched “okapi”." in project and "No sessions yet" not in project
    assert "/search?q=okapi&amp;project=alpha" in project


def test_a_search_finds_the_same_with_its_values_bound_as_with_them_written_in(world, api_as, team, settings):
    """The stock path of docs/infrastructure.md#search_literals (values bound) answers alike."""
    api = api_as(team.viewer)
    queries = ["platypus", "platypus burrow", "PLATYP", "½"]
    ours = [found(api, q) for q in queries]
    settings.TRELLIS_STOCK = frozenset({"search_literals"})
    assert [found(api, q) for q in queries] == ours
    assert keys(ours[0])  # it found something to compare

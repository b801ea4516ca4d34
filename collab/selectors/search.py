"""Finding anything a person may see by its words (docs/web-app.md#search): messages, branch
names and session titles across their projects.

A query is cut into words the way the index cuts text (at every character that is not a letter
or a digit, lowercased); each word matches the words that start with it — a one-character word
only itself — and a result matches every word. What is searched of a message is its text and
its tool calls' strings (the tool's name, its arguments' values), as indexed by migration
``collab/0028_search``: a GIN expression index on PostgreSQL, a contentless FTS5 table on
SQLite. Titles and branch names are few and short: read by ``icontains`` and checked word by
word here, under the same rule.

Only sessions the viewer may see are read (``collab.access.visible_sessions``, in the query,
never filtered after a limit); snippets are cut from text that went through ``redact_texts``
first, and a message whose words matched only in what redaction blanked (a hidden session's
title quoted in a result) is left out, so a search never tells what a hidden session holds.
Messages of archived branches are found like any other (their history is kept and readable) and
say ``archived``; attach pointers are not rows of a transcript and are never found.

Order: matching session titles, then branch names (most recently active first), together at
most half of ``limit`` when messages fill the rest; then messages: the newest ``CANDIDATES``
matches, by relevance (BM25 over their words, here, the same on both databases), newest first
among equals. The index finds every match, so a word in most messages costs more to find than a
rare one (bench/search.py measures both); ranking costs the same whatever the number.
Cost: a fixed number of queries, whatever the number of matches (``MAX_QUERIES``).
"""

import functools
import json
import math
import re
import unicodedata
from datetime import UTC, date
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from collab.access import visible_sessions
from collab.errors import Invalid
from collab.models import Branch, Message, MessageKind
from collab.selectors.redact import redact_calls, redact_texts, strings_in

MAX_QUERY_CHARS = 200
MAX_TERMS = 8  # words of a query past these are ignored
DEFAULT_LIMIT = 20
MAX_LIMIT = 50
CANDIDATES = 200  # the newest this many matching messages are ranked
NAME_CANDIDATES = 4  # titles and names read per result asked, before the word-by-word check
SNIPPET_CHARS = 220
MAX_QUERIES = 13  # sessions, branches, candidates (five windows on PostgreSQL), rows, redact_texts' five

_WORD = re.compile(r"[^\W_]+")


def search_terms(q) -> list[str]:
    """The words ``q`` is searched by (lowercased, in order, without repeats, at most
    ``MAX_TERMS``): none when it holds no letter or digit. ``Invalid`` (400 ``invalid_query``)
    when there is no query, only blanks, or more than ``MAX_QUERY_CHARS`` characters."""
    if not isinstance(q, str) or not q.strip():
        raise Invalid("give the words to search for in q", code="invalid_query")
    if len(q) > MAX_QUERY_CHARS:
        raise Invalid(f"q is {len(q)} characters long; search with at most {MAX_QUERY_CHARS}", code="invalid_query")
    words = [w.lower() for w in _WORD.findall(unicodedata.normalize("NFC", q))]
    return list(dict.fromkeys(words))[:MAX_TERMS]


def clamp_limit(limit) -> int:
    """``limit`` kept in 1–``MAX_LIMIT`` (``DEFAULT_LIMIT`` when not given)."""
    return DEFAULT_LIMIT if limit is None else max(1, min(int(limit), MAX_LIMIT))


def search(viewer, q: str, project=None, limit: int | None = DEFAULT_LIMIT) -> list[dict]:
    """What ``viewer`` may see that matches ``q`` (in ``project`` when given: the caller has
    authorized it), best first, at most ``limit`` results (kept in 1–``MAX_LIMIT``).

    Each result: ``kind`` (``session``, ``branch`` or ``message``), ``project`` (slug),
    ``session``, ``session_title``, ``branch`` and ``branch_name`` (None for a session),
    ``archived``, ``message`` and ``role`` (None but for a message), ``snippet`` (HTML: escaped
    text around the first match, each matching word in ``<mark>``), ``created_at`` and ``url``
    (the session page, opening that branch at that message). Raises ``Invalid`` for a bad ``q``
    (``search_terms``)."""
    terms = search_terms(q)
    limit = clamp_limit(limit)
    if not terms:
        return []
    sessions = visible_sessions(viewer)
    if project is not None:
        sessions = sessions.filter(project=project)
    titled = _named(sessions.select_related("project").order_by("-last_active_at"), "title", terms, limit)
    branches = _named(Branch.objects.filter(session__in=sessions.order_by().values("pk"))
                      .select_related("session__project").order_by("-last_active_at"), "name", terms, limit)
    messages = _messages(sessions, terms, limit)

    # every text a result shows, redacted in one batch
    texts = []

    def shown(value) -> int:
        texts.append(value)
        return len(texts) - 1

    rows = ([(s, shown(s.title)) for s in titled],
            [(b, shown(b.name), shown(b.session.title)) for b in branches],
            [(m, shown(m.text), shown(m.tool_calls), shown(m.session.title), shown(m.branch.display_name))
             for m in messages])
    texts, hidden = redact_texts(viewer, texts)
    found = [_session_hit(s, texts[title], terms) for s, title in rows[0] if _matches(texts[title], terms)]
    found += [_branch_hit(b, texts[name], texts[title], terms) for b, name, title in rows[1]
              if _matches(texts[name], terms)]
    hits = []
    for m, text, calls, title, name in rows[2]:
        text = texts[text]
        calls = redact_calls(m.tool_calls, hidden)[0] if hidden and isinstance(m.tool_calls, list) else texts[calls]
        if (text, calls) != (m.text, m.tool_calls) and not _matches(_searched(text, calls), terms):
            continue  # its words were in what redaction blanked
        hits.append(_message_hit(m, text, calls, texts[title], texts[name], terms))
    room = limit - min(len(hits), limit // 2)
    found = found[:room]
    return found + hits[:limit - len(found)]


# --- titles and branch names --------------------------------------------------------------------


def _named(rows, field: str, terms: list[str], limit: int) -> list:
    """The rows whose ``field`` holds every term (``icontains``, then word by word): one query."""
    contains = Q()
    for term in terms:
        contains &= Q(**{f"{field}__icontains": term})
    return [row for row in rows.filter(contains)[:limit * NAME_CANDIDATES] if _matches(getattr(row, field), terms)]


# --- messages -----------------------------------------------------------------------------------

# Both databases find the newest CANDIDATES matching messages the viewer may see (the index
# gives the matches; their ids are sorted by time, no text carried), with the start of what was
# searched of each (RANKED_CHARS of its text and of its tool calls' strings); ``_ranked`` orders
# them. Ranking in Python costs the same on both, whatever the database's own text functions cost.
#
# On PostgreSQL the index also holds each message's day and month (``_dN``, ``_mN``: migration
# collab/0028_search), and the search asks first for matches of the last day, then of the last
# week, month and year, then of any time (``_windows``), and stops at the first that holds
# CANDIDATES: each holds every message newer than its start, so its newest matches are the newest
# of all. A word in most messages then reads a day's matches, not the whole table's.
_POSTGRES = """
SELECT m.id, left(m.text, %s) || ' ' || left(coalesce(
    jsonb_path_query_array(m.tool_calls, 'strict $.** ? (@.type() == "string")')::text, ''), %s)
FROM (
    SELECT m.id, m.created_at FROM collab_message m
    WHERE numnode(to_tsquery('simple'::regconfig, %s)) > 0
      AND collab_message_search_document(m.text, m.tool_calls, m.created_at) @@ ({query})
      AND m.kind <> %s AND m.session_id IN ({sessions})
    ORDER BY m.created_at DESC, m.id DESC LIMIT %s
) c JOIN collab_message m ON m.id = c.id
ORDER BY c.created_at DESC, c.id DESC
"""
_WORDS = "to_tsquery('simple'::regconfig, %s)"
_IN_WINDOW = "to_tsquery('simple'::regconfig, %s) && %s::tsquery"  # ``_dN`` is written, not parsed: ``_`` is no separator there

# the FTS table's rowid is the message id read as a number (migration collab/0028_search)
_SQLITE = """
SELECT m.id, substr(m.text, 1, %s) || ' ' || substr(coalesce(CASE WHEN json_valid(m.tool_calls) THEN
    (SELECT group_concat(value, ' ') FROM json_tree(m.tool_calls) WHERE type = 'text') END, ''), 1, %s)
FROM collab_message_fts JOIN collab_message m ON m.id = printf('%%012x', collab_message_fts.rowid)
WHERE collab_message_fts MATCH %s AND m.kind <> %s AND m.session_id IN ({sessions})
ORDER BY m.created_at DESC, m.id DESC
LIMIT %s
"""

RANKED_CHARS = 2_000  # of a candidate's text, and of its tool calls' strings, read to rank it
SPARE = 5  # messages read past ``limit``, for those redaction leaves out
BM25_K1, BM25_B = 1.2, 0.75
EPOCH = date(2000, 1, 1)  # ``_dN``: N days after it
WINDOW_DAYS = (1, 7, 31)  # then WINDOW_MONTHS, then any time
WINDOW_MONTHS = 12


def _tsquery(terms: list[str]) -> str:
    """PostgreSQL's query: every term, each a prefix but a single character (terms hold letters
    and digits only: nothing in them is tsquery syntax)."""
    return " & ".join(term if len(term) == 1 else f"{term}:*" for term in terms)


def _fts5_query(terms: list[str]) -> str:
    """FTS5's query, the same rule (each term quoted: ``AND``, ``NEAR`` are words here)."""
    return " AND ".join(f'"{term}"' if len(term) == 1 else f'"{term}"*' for term in terms)


def _windows(now) -> list[str | None]:
    """The index's words for the last day, week and month (by day), the last year (by month), then
    None (any time): each window from its start to tomorrow (a clock a little ahead)."""
    today = now.astimezone(UTC).date()
    day = (today - EPOCH).days
    month = today.year * 12 + today.month - 1
    windows = [" | ".join(f"'_d{n}'" for n in range(day - days + 1, day + 2)) for days in WINDOW_DAYS]
    windows.append(" | ".join(f"'_m{n}'" for n in range(month - WINDOW_MONTHS + 1, month + 2)))
    return [*windows, None]


def candidates_statements(sessions, terms: list[str]) -> list[tuple[str, list | None]]:
    """The SQL and parameters of ``_candidates``, one statement a window (bench/search.py explains them).

    On PostgreSQL every value is written into the SQL (quoted by psycopg), none bound: a statement
    run often is prepared (``DB_PREPARE_THRESHOLD``), and its plan made for any value would assume
    a query word in few messages and the viewer in few sessions — a nested loop over the sessions
    for each match, seconds for a common word. With the values in it, the plan is the one for them."""
    sessions_sql, sessions_params = sessions.order_by().values("pk").query.sql_with_params()
    if connection.vendor != "postgresql":
        return [(_SQLITE.format(sessions=sessions_sql), [RANKED_CHARS, RANKED_CHARS, _fts5_query(terms),
                                                         MessageKind.ATTACH, *sessions_params, CANDIDATES])]
    statements = []
    for window in _windows(timezone.now()):
        query = (_IN_WINDOW, [_tsquery(terms), window]) if window else (_WORDS, [_tsquery(terms)])
        sql = _POSTGRES.format(query=query[0], sessions=sessions_sql)
        # a word PostgreSQL reads as no word (``½``) leaves no query: then nothing matches, not the window
        params = [RANKED_CHARS, RANKED_CHARS, _tsquery(terms), *query[1], MessageKind.ATTACH, *sessions_params,
                  CANDIDATES]
        if "search_literals" in settings.TRELLIS_STOCK:  # bound values, as any query (docs/infrastructure.md)
            statements.append((sql, params))
        else:
            statements.append((connection.ops.compose_sql(sql, params), None))
    return statements


def _candidates(sessions, terms: list[str]) -> list[tuple[str, str]]:
    """(id, the start of what was searched) of the newest ``CANDIDATES`` matching messages of
    ``sessions``, newest first: one query on SQLite, one a window on PostgreSQL until one holds
    ``CANDIDATES`` (at most five)."""
    with connection.cursor() as cursor:
        for statement in candidates_statements(sessions, terms):
            cursor.execute(*statement)
            rows = cursor.fetchall()
            if len(rows) >= CANDIDATES:
                break
        return rows


def _ranked(candidates: list[tuple[str, str]], terms: list[str]) -> list[str]:
    """The candidates' ids, best first by BM25 over their words (each term's weight from how
    few candidates hold it; a word counted for the terms it starts with), newest first among
    equals."""
    counted = []
    for pk, text in candidates:
        counts = dict.fromkeys(terms, 0)
        for _, _, matched in _hits(text or "", terms):
            for term in matched:
                counts[term] += 1
        counted.append((pk, counts, (text or "").count(" ") + 1))  # its length in words, near enough
    if not counted:
        return []
    average = sum(length for _, _, length in counted) / len(counted) or 1
    held = {term: sum(1 for _, counts, _ in counted if counts[term]) for term in terms}
    weight = {term: math.log(1 + (len(counted) - n + 0.5) / (n + 0.5)) for term, n in held.items()}

    def score(item) -> float:
        _, counts, length = item
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / average)
        return sum(weight[t] * c * (BM25_K1 + 1) / (c + norm) for t, c in counts.items() if c)

    return [pk for pk, _, _ in sorted(counted, key=score, reverse=True)]  # stable: newest first among equals


def _messages(sessions, terms: list[str], limit: int) -> list[Message]:
    """The best matching messages of ``sessions``, best first: two queries (the candidates, then
    the chosen rows with their session, project and branch)."""
    ids = _ranked(_candidates(sessions, terms), terms)[:limit + SPARE]
    if not ids:
        return []
    rows = Message.objects.filter(pk__in=ids).select_related("session__project", "branch")
    by_id = {m.pk: m for m in rows}
    return [by_id[i] for i in ids if i in by_id]


# --- what a result shows ------------------------------------------------------------------------


def _searched(text: str, calls) -> str:
    """What the index holds of a message: its text and its tool calls' strings."""
    return " ".join([text, *strings_in(calls)]) if calls else text


def _shown(text: str, calls) -> str:
    """A message as a result shows it: its text, then each tool call as ``name(arguments)``."""
    if not isinstance(calls, list) or not calls:
        return text
    rendered = ", ".join(f"{c.get('name')}({json.dumps(c.get('arguments', {}), ensure_ascii=False)})"
                         if isinstance(c, dict) else str(c) for c in calls)
    return f"{text} → {rendered}" if text else rendered


@functools.lru_cache(maxsize=64)
def _matcher(terms: tuple[str, ...]) -> re.Pattern:
    """The words the terms match: a word starting with a term (one character: that word alone)."""
    alternatives = "|".join(re.escape(t) + (r"[^\W_]*" if len(t) > 1 else r"(?![^\W_])")
                            for t in sorted(terms, key=len, reverse=True))
    return re.compile(rf"(?<![^\W_])(?:{alternatives})", re.IGNORECASE)


def _word_matches(word: str, term: str) -> bool:
    return word == term or (len(term) > 1 and word.startswith(term))


def _hits(text: str, terms: list[str]):
    """(start, end, the terms it matches) of each word of ``text`` that a term matches."""
    for found in _matcher(tuple(terms)).finditer(text):
        lowered = found.group().lower()
        matched = tuple(t for t in terms if _word_matches(lowered, t))
        if matched:
            yield found.start(), found.end(), matched


def _matches(text: str, terms: list[str]) -> bool:
    """Whether ``text`` holds every term (as the index decides: a word starting with it)."""
    return set(terms) <= {t for _, _, matched in _hits(text or "", terms) for t in matched}


def snippet(text: str, terms: list[str], width: int = SNIPPET_CHARS) -> SafeString:
    """``text`` (whitespace folded) around its first match, at most about ``width`` characters,
    cut at word ends with "…", HTML-escaped, each matching word in ``<mark>``."""
    text = " ".join((text or "").split())
    spans = list(_hits(text, terms))
    start = 0
    if spans and spans[0][1] > width:  # the first match is further on: start a little before it
        first = spans[0][0]
        space = text.find(" ", max(0, first - width // 3), first)
        start = space + 1 if space >= 0 else max(0, first - width // 3)
    end = min(len(text), start + width)
    if end < len(text):
        space = text.rfind(" ", start, end)
        end = space if space > start else end
    out, at = [], start
    for s, e, _ in spans:
        if start <= s and e <= end:
            out.append(escape(text[at:s]) + "<mark>" + escape(text[s:e]) + "</mark>")
            at = e
    out.append(escape(text[at:end]))
    return mark_safe(("…" if start > 0 else "") + "".join(out) + ("…" if end < len(text) else ""))


def _url(session_id: str, **params) -> str:
    url = reverse("collab:session", args=[session_id])
    params = {k: v for k, v in params.items() if v}
    return f"{url}?{urlencode(params)}" if params else url


def _session_hit(session, title: str, terms: list[str]) -> dict:
    return {"kind": "session", "project": session.project.slug, "session": session.pk, "session_title": title,
            "branch": None, "branch_name": None, "archived": False, "message": None, "role": None,
            "snippet": snippet(title, terms), "created_at": session.created_at, "url": _url(session.pk)}


def _branch_hit(branch, name: str, title: str, terms: list[str]) -> dict:
    session = branch.session
    return {"kind": "branch", "project": session.project.slug, "session": session.pk, "session_title": title,
            "branch": branch.pk, "branch_name": name, "archived": branch.archived, "message": None, "role": None,
            "snippet": snippet(name, terms), "created_at": branch.created_at, "url": _url(session.pk, branch=branch.pk)}


def _message_hit(m: Message, text: str, calls, title: str, name: str, terms: list[str]) -> dict:
    session, branch = m.session, m.branch
    return {"kind": "message", "project": session.project.slug, "session": session.pk, "session_title": title,
            "branch": branch.pk, "branch_name": name, "archived": branch.archived, "message": m.pk, "role": m.role,
            "snippet": snippet(_shown(text, calls), terms), "created_at": m.created_at,
            "url": _url(session.pk, branch=branch.pk, head=m.pk)}

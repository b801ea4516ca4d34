"""References to sessions a viewer may not see, blanked per viewer (docs/contract.md#visibility).

A session the viewer sees may still *name* one they may not: an agent spawned from it into a
private session (``agent.spawned``), a delivery to or from one (``delivery.*``, ``inbox.*``), a
prompt whose header says ``[task from SID:MSG]``, a result notice ``[result from SID:MSG]``.
What the viewer is shown (the events API, the socket, the page's activity and transcript, the
transcript route and ``read_conversation``) goes through here first: every field that points
into a hidden session is set to ``None`` (with ``"redacted": true`` on the payload), the names,
previews and reasons that describe it are blanked too, and the session's id (alone or as an
address) inside free text reads ``another session``.

Cost: at most four queries per batch, however many events or messages — the sessions of the
branch ids, of the job ids and of the attach nodes named (``Memo`` keeps those for a socket:
they never change), and one for which referenced sessions the viewer may not see. The model's own context is never
redacted here: an agent acts for the person who started its root turn, who may see it.
"""

import re
from dataclasses import dataclass, field

from collab.access import visible_session_ids
from collab.events import with_full_payloads
from collab.models import Branch, Job, Message, MessageKind, Session

REDACTED = "another session"
SESSION_KEYS = ("session", "caller_session", "sender_session")
ADDRESS_KEYS = ("start_from", "forked_from", "from", "to", "target", "caller", "address")
BRANCH_KEYS = ("branch", "target_branch")
JOB_KEYS = ("job", "into", "caller_job", "parent_job")
JOB_LIST_KEYS = ("jobs",)
LISTED_KEY = "session_ids"  # a listing's sessions: hidden ones are left out and not counted, silently
# what describes the referenced row: blanked with it
ABOUT_KEYS = ("name", "task_name", "title", "text_preview", "reason", "attach")
TEXT_KEYS = ("text",)
_ID = re.compile(r"\b[0-9a-f]{12}\b")


@dataclass
class Memo:
    """Branch → session and job → session (facts that never change), kept across batches."""

    branch_session: dict = field(default_factory=dict)
    job_session: dict = field(default_factory=dict)
    attach_session: dict = field(default_factory=dict)  # an attach node → the session it points into

    LIMIT = 10_000  # a long-lived socket's memo is dropped past this many rows (then read again)

    def trim(self) -> None:
        """Drop a map past ``LIMIT``: replaced, never cleared in place, so a reader on another
        thread holding it (``names_no_other_session`` on the event loop) keeps a whole one."""
        for name in ("branch_session", "job_session", "attach_session"):
            if len(getattr(self, name)) > self.LIMIT:
                setattr(self, name, {})

    def snapshot(self) -> "Memo":
        """The maps as they are now (the same dicts: ``trim`` replaces, never clears them)."""
        return Memo(self.branch_session, self.job_session, self.attach_session)


def _session_of_address(value) -> str | None:
    if not isinstance(value, str) or value == "clean":
        return None
    sid = value.split(":", 1)[0]
    return sid if _ID.fullmatch(sid) else None


def strings_in(value):
    """Every string inside a JSON-like value (dict values, list items), depth first."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from strings_in(v)


def _ids_in(values) -> set[str]:
    return {token for value in values for text in strings_in(value) for token in _ID.findall(text)}


def hidden_among(viewer, session_ids, *, own: str | None = None) -> dict[str, tuple[str, ...]]:
    """Those of ``session_ids`` that are sessions ``viewer`` may not see, with the names that would
    give them away — the title and the branch names (two queries; none when there is nothing to
    ask about). Ids that are no session are not hidden:
    nothing to leak."""
    asked = {s for s in session_ids if s and s != own}
    if not asked:
        return {}
    hidden = dict(Session.objects.filter(pk__in=asked).exclude(pk__in=visible_session_ids(viewer))
                  .values_list("pk", "title"))
    if not hidden:
        return {}
    # its branches' names too: a text that names the session by id ("[result from SID:…] Agent
    # 'name' finished") names them beside it (one more query, only when something is hidden)
    names: dict[str, list[str]] = {sid: [title] for sid, title in hidden.items()}
    for sid, name in Branch.objects.filter(session_id__in=list(hidden)).values_list("session_id", "name"):
        names[sid].append(name)
    return {sid: tuple(n for n in found if n) for sid, found in names.items()}


def with_hidden_rows(hidden: dict, values) -> dict:
    """``hidden`` plus the rows of those sessions (jobs, messages, branches) that ``values`` name
    by id — a result's "finished execution JOB" — so ``scrub`` blanks them too (three queries,
    only when a hidden session is named and other ids stand beside it)."""
    tokens = _ids_in(values) - set(hidden) if hidden else set()
    if not tokens:
        return hidden
    sessions = list(hidden)
    rows = set()
    for model in (Job, Message, Branch):
        rows |= set(model.objects.filter(pk__in=tokens, session_id__in=sessions).values_list("pk", flat=True))
    return {**hidden, **{row: () for row in rows}} if rows else hidden


MIN_TITLE_CHARS = 4  # a shorter title is not rewritten in text (it would garble ordinary words)


def scrub(value, hidden: dict[str, str]):
    """``value`` (text, or JSON-like data) with each hidden session's id — alone or as the
    ``SID:X`` address of one of its rows — replaced by ``another session``; in a text that
    names such a session by id, its title too (a listing: ``session SID · title``)."""
    if not hidden:
        return value
    if isinstance(value, str):
        for sid, titles in hidden.items():
            if sid not in value:
                continue
            for title in sorted(titles if isinstance(titles, tuple) else (titles,), key=len, reverse=True):
                if title and len(title.strip()) >= MIN_TITLE_CHARS:
                    value = value.replace(title, REDACTED)
        pattern = re.compile(r"\b(?:" + "|".join(sorted(hidden)) + r")(?::[0-9a-f]{12})?\b")
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {k: scrub(v, hidden) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, hidden) for v in value]
    return value


def redact_texts(viewer, texts: list, *, own: str | None = None) -> tuple[list, dict]:
    """``texts`` (strings or JSON-like values) as ``viewer`` may read them: every hidden session's
    id, address, title and branch names, and its rows' ids where it is named, read ``another
    session`` (``scrub``). The one scrubbing path of every reader of free text — transcripts,
    graph labels, execution results. Returns (texts, the hidden sessions found): none found and
    no query when no text holds an id-shaped token but ``own``; else one or two queries, and
    three more when a hidden session is named beside other ids."""
    hidden = hidden_among(viewer, _ids_in(texts), own=own)
    if not hidden:
        return texts, {}
    hidden = with_hidden_rows(hidden, texts)
    return [scrub(t, hidden) for t in texts], hidden


def _fill(memo_map: dict, model, ids: set) -> None:
    missing = {i for i in ids if isinstance(i, str) and i not in memo_map}
    if missing:
        memo_map.update(dict(model.objects.filter(pk__in=missing).values_list("pk", "session_id")))


def _attach_id(wire: dict) -> str | None:
    """The message id of a ``message.created`` event of an attach node ("spawned 'name'")."""
    payload = wire.get("payload") or {}
    if wire.get("type") == "message.created" and payload.get("kind") == MessageKind.ATTACH:
        return payload.get("id")
    return None


def _fill_attaches(memo: Memo, ids: set) -> None:
    missing = {i for i in ids if i and i not in memo.attach_session}
    if missing:
        for pk, metadata in Message.objects.filter(pk__in=missing).values_list("pk", "metadata"):
            memo.attach_session[pk] = ((metadata or {}).get("attach") or {}).get("session_id")


def _references(payload: dict, memo: Memo) -> dict[str, str | None]:
    """{key: the session it points into} for the payload's reference fields."""
    refs = {}
    for key in SESSION_KEYS:
        if isinstance(payload.get(key), str):
            refs[key] = payload[key]
    for key in ADDRESS_KEYS:
        if (sid := _session_of_address(payload.get(key))) is not None:
            refs[key] = sid
    for key in BRANCH_KEYS:
        if isinstance(payload.get(key), str):
            refs[key] = memo.branch_session.get(payload[key])
    for key in JOB_KEYS:
        if isinstance(payload.get(key), str):
            refs[key] = memo.job_session.get(payload[key])
    return refs


def _payloads(wires: list[dict]) -> list[dict]:
    return [w["payload"] for w in wires if isinstance(w.get("payload"), dict)]


def _fill_memo(wires: list[dict], payloads: list[dict], memo: Memo) -> None:
    """Learn the session of every branch, job and attach node the wires name (at most three
    queries, none for what the memo knows already)."""
    _fill(memo.branch_session, Branch, {p.get(k) for p in payloads for k in BRANCH_KEYS})
    _fill(memo.job_session, Job, {p.get(k) for p in payloads for k in JOB_KEYS}
          | {j for p in payloads for k in JOB_LIST_KEYS if isinstance(p.get(k), list) for j in p[k]})
    _fill_attaches(memo, {_attach_id(w) for w in wires})


def _asked(wires: list[dict], payloads: list[dict], memo: Memo) -> set:
    """The sessions (or ids that may be sessions) the wires name, as far as ``memo`` knows."""
    asked = {memo.attach_session.get(_attach_id(w)) for w in wires}
    for p in payloads:
        asked |= {s for s in _references(p, memo).values() if s}
        asked |= {memo.job_session.get(j) for k in JOB_LIST_KEYS if isinstance(p.get(k), list) for j in p[k]}
        asked |= _ids_in([p.get(k) for k in TEXT_KEYS] + [p.get("tool_calls")])
        if isinstance(p.get(LISTED_KEY), list):
            asked |= {s for s in p[LISTED_KEY] if isinstance(s, str)}
    return asked


def _known(ids, known: dict) -> bool:
    return all(i in known for i in ids if isinstance(i, str) and i)


def names_no_other_session(session_id: str, wires: list[dict], memo: Memo) -> bool:
    """True when the wires certainly name no session but ``session_id`` — every viewer of that
    session then sees them unchanged — decided without a query (from what ``memo`` knows).
    False means "ask ``redact_wires``": an id the memo does not know, or another session named."""
    memo = memo.snapshot()  # checked and used whole, whatever a catch-up read trims meanwhile
    payloads = _payloads(wires)
    if not payloads:
        return True
    if not (_known({p.get(k) for p in payloads for k in BRANCH_KEYS}, memo.branch_session)
            and _known({p.get(k) for p in payloads for k in JOB_KEYS}, memo.job_session)
            and _known({j for p in payloads for k in JOB_LIST_KEYS if isinstance(p.get(k), list) for j in p[k]},
                       memo.job_session)
            and _known({_attach_id(w) for w in wires}, memo.attach_session)):
        return False
    return not (_asked(wires, payloads, memo) - {session_id, None})


def redact_wires(viewer, session_id: str, wires: list[dict], memo: Memo | None = None) -> list[dict]:
    """Event wires (``Event.as_wire()``) of session ``session_id`` as ``viewer`` may see them:
    same events, same ``seq``s (a socket's stream stays gapless), hidden references blanked."""
    return redact_wires_for({None: viewer}, session_id, wires, memo)[None]


def redact_wires_for(viewers: dict, session_id: str, wires: list[dict], memo: Memo | None = None) -> dict:
    """``redact_wires`` for several viewers at once (``{key: viewer}`` → ``{key: wires}``): what
    the wires name is looked up once, then each viewer's hidden sessions (two queries a viewer,
    none for anybody when the wires name no other session). A viewer who may see everything named
    gets the very ``wires`` list back."""
    memo = memo if memo is not None else Memo()
    memo.trim()
    payloads = _payloads(wires)
    if not payloads:
        return {key: wires for key in viewers}
    _fill_memo(wires, payloads, memo)
    asked = _asked(wires, payloads, memo) - {session_id, None}
    return {key: _redacted_for(viewer, session_id, wires, payloads, memo, asked) if asked else wires
            for key, viewer in viewers.items()}


def _redacted_for(viewer, session_id: str, wires: list[dict], payloads: list[dict], memo: Memo, asked: set):
    hidden = hidden_among(viewer, asked, own=session_id)
    if not hidden:
        return wires
    hidden = with_hidden_rows(hidden, [p.get(k) for p in payloads for k in TEXT_KEYS])
    return [{**w, "payload": _redact_payload(w["payload"], hidden, memo, memo.attach_session.get(_attach_id(w)))}
            if isinstance(w.get("payload"), dict) else w for w in wires]


def _redact_payload(payload: dict, hidden: dict[str, str], memo: Memo, attach_session: str | None = None) -> dict:
    out = dict(payload)
    blanked = False
    if attach_session in hidden:  # an attach node's text names the branch spawned there
        out["text"], blanked = None, True
    for key, sid in _references(payload, memo).items():
        if sid in hidden:
            out[key] = None
            blanked = True
    for key in JOB_LIST_KEYS:
        if isinstance(payload.get(key), list):
            kept = [j for j in payload[key] if memo.job_session.get(j) not in hidden]
            if len(kept) != len(payload[key]):
                out[key], blanked = kept, True
    for key in TEXT_KEYS:
        if isinstance(out.get(key), str):
            out[key] = scrub(out[key], hidden)
    if isinstance(payload.get("tool_calls"), list):
        out["tool_calls"], named = redact_calls(payload["tool_calls"], hidden)
        blanked = blanked or named
    if isinstance(payload.get(LISTED_KEY), list):  # a listing as the reader would have got it
        out[LISTED_KEY] = [s for s in payload[LISTED_KEY] if s not in hidden]
        if isinstance(payload.get("sessions"), int):
            out["sessions"] = len(out[LISTED_KEY])
    if blanked:
        for key in ABOUT_KEYS:
            if key in out:
                out[key] = None
        out["redacted"] = True
    return out


def redact_calls(calls: list, hidden: dict[str, str]) -> tuple[list, bool]:
    """Tool calls as a viewer may see them: a call whose arguments name a hidden session (an
    ``agent(start_from=…)``, a ``send_message(to=…)``) keeps its name, not its arguments — they
    may also carry that session's branch names and prompts. Returns (calls, whether any was cut)."""
    out, cut = [], False
    for call in calls:
        if isinstance(call, dict) and scrub(call.get("arguments"), hidden) != call.get("arguments"):
            out.append({**call, "arguments": {"redacted": True}})
            cut = True
        else:
            out.append(call)
    return out, cut


def redact_events(viewer, session_id: str, events) -> list[dict]:
    """``Event`` rows of one session as the wires ``viewer`` may see (at most six queries: up to
    two give events stored as references their whole payload back, in place on the rows)."""
    return redact_wires(viewer, session_id, [e.as_wire() for e in with_full_payloads(events)])


def redact_messages(viewer, session_id: str, messages) -> dict[str, str]:
    """Scrub hidden sessions' ids out of the messages' text, tool calls and metadata, in place
    (the rows are for display; never saved). Returns the hidden sessions found."""
    texts, hidden = redact_texts(viewer, [m.text for m in messages] + [m.metadata for m in messages]
                                 + [m.tool_calls for m in messages], own=session_id)
    if hidden:
        n = len(messages)
        for i, m in enumerate(messages):
            m.text, m.metadata = texts[i], texts[n + i]
            if isinstance(m.tool_calls, list):
                m.tool_calls = redact_calls(m.tool_calls, hidden)[0]
    return hidden


def redact_jobs(viewer, jobs: list, *, own: str | None = None) -> list:
    """Job rows for display with their error text scrubbed (``redact_texts``), in place: the rows
    are never saved."""
    texts, hidden = redact_texts(viewer, [j.error_reason for j in jobs], own=own)
    if hidden:
        for job, text in zip(jobs, texts):
            job.error_reason = text
    return jobs


EXECUTION_TEXT_KEYS = ("result", "error_reason")


def redact_executions(viewer, shapes: list[dict]) -> list[dict]:
    """Execution shapes as ``viewer`` may read them: ``caller_session`` / ``parent_job`` blanked
    where they are in a session ``viewer`` may not see (a task sent from a private session), and
    the result and error text scrubbed (``redact_texts``: a result may name where the agent worked)."""
    parent_ids = {s["parent_job"] for s in shapes if s.get("parent_job")}
    parents = dict(Job.objects.filter(pk__in=parent_ids).values_list("pk", "session_id")) if parent_ids else {}
    hidden = hidden_among(viewer, {s.get("caller_session") for s in shapes} | set(parents.values()))
    if hidden:
        shapes = [{**s, "caller_session": None if s.get("caller_session") in hidden else s.get("caller_session"),
                   "parent_job": None if parents.get(s.get("parent_job")) in hidden else s.get("parent_job")}
                  for s in shapes]
    owns = {s.get("session") for s in shapes}
    texts, named = redact_texts(viewer, [[s.get(k) for k in EXECUTION_TEXT_KEYS] for s in shapes],
                                own=next(iter(owns)) if len(owns) == 1 else None)
    if not named:
        return shapes
    return [{**s, **dict(zip(EXECUTION_TEXT_KEYS, scrubbed))} for s, scrubbed in zip(shapes, texts)]

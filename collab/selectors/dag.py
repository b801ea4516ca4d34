"""The session DAG: one keyset page of rows and every edge that touches it.

A page is the newest ``PAGE_ROWS`` messages of the session older than a cursor (a message id;
rows are ordered by ``(created_at, id)``, attach pointers are edges, not rows). Whatever the
session's length, a page costs the same fixed set of queries (``DAG_QUERIES`` at most):

1. the session's branches, each with its first message's time (an index probe per branch)
   and its tip's (its lane, archive state, fork point);
2. the cursor row (only with ``before``/``since``);
3. the page's rows;
4. the jobs called from or into the page's rows (spawn, delegation and message edges);
5. the jobs whose results arrive on, or leave from, the page's rows, each with its last row;
6. results that left the page's rows and arrived below it (only when there are such);
7. the branches with an open turn (live lanes);
8. which of the other sessions named by those edges the viewer may see (only when there are any);
9. which of the sessions named by id in the rows' labels the viewer may not see (only when a label
   holds an id-shaped token; when one names a hidden session, up to four more read its names
   and rows so that the label says "another session" instead — ``redact_texts``);
10. the pending asks stopped at the page's rows, and which of them the viewer may decide (only when
   a lane waits for a person; ``collab.selectors.waiting.asks_at_rows``): the waiting node is
   marked, and the viewer's own get the inbox's controls below the graph (docs/web-app.md#inbox);

and a replay (``at``) the three of ``collab.selectors.replay.replay_state`` (event ``at``'s time, the
session's branch and job events: which branches existed then, under which name, archived or not)
and one for the branches with a job open then (live lanes), only when there are such jobs.

Another session the viewer may not see is drawn as "another session": no id, no title, no link
(indistinguishable from none).
"""

from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Substr
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from collab.access import visible_sessions
from collab.dag_layout import End, Lane, Link, Row, layout
from collab.errors import Invalid
from collab.selectors.branch_labels import branch_labels
from collab.selectors.redact import redact_texts
from collab.selectors.replay import Replay, lane_state, replay_state
from collab.selectors.waiting import asks_at_rows
from collab.selectors.replay import replay_cutoff  # noqa: F401 (its home before replay.py: collab.events cites it here)
from collab.models import Branch, FollowupState, Job, JobKind, Message, MessageKind

PAGE_ROWS = 150
WAITING = "waiting for a person"  # a live lane's state (``lane_state``) whose turn waits on an ask
SINCE_MAX_ROWS = 2 * PAGE_ROWS  # a live refresh of the newest block (its bound per event); past this it starts a fresh newest page
DAG_QUERIES = 10
SNIPPET = 160

_KIND_LABEL = {
    MessageKind.AGENT_MESSAGE: "result",
    MessageKind.NOTICE: "notice",
    MessageKind.FOLLOWUP: "result",
    MessageKind.TASK: "task",
    MessageKind.MESSAGE: "message",
    MessageKind.AGENT_SPAWN: "spawned",
}


def _before(c) -> Q:
    return Q(created_at__lt=c[0]) | Q(created_at=c[0], id__lt=c[1])


def _at_or_after(c) -> Q:
    return Q(created_at__gt=c[0]) | Q(created_at=c[0], id__gte=c[1])


def row_label(m) -> str:
    """What a row says: who, what kind, and the start of its text (as text: the template escapes it)."""
    text = m.snippet or ""
    header = (m.metadata or {}).get("header") if isinstance(m.metadata, dict) else ""
    if header and text.startswith(header):
        text = text[len(header):]
    elif header and header.startswith(text):  # the snippet ends inside the header: nothing of the body
        text = ""
    if m.kind in _KIND_LABEL:
        who = _KIND_LABEL[m.kind]
        if m.kind in (MessageKind.AGENT_MESSAGE, MessageKind.NOTICE, MessageKind.FOLLOWUP):
            status = (m.metadata or {}).get("status")
            return f"{who}: {status}" if status else who
    elif m.role == "assistant" and m.tool_calls and not text.strip():
        names = ", ".join(str(c.get("name", "?")) for c in m.tool_calls if isinstance(c, dict))
        return f"assistant → {names}"
    else:
        who = m.role
    return f"{who}: {text}" if text.strip() else who


def dag_page(session, viewer, *, before: str | None = None, since: str | None = None,
             at: int | None = None, selected: str | None = None, replay: Replay | None = None) -> dict:
    """One page of the session's graph, laid out. ``before``: the page older than that row
    (a "load older" request); ``since``: every row from that one on (the live block's refresh);
    neither: the newest page. ``at``: as of event ``at`` (replay; read-only: the rows written by
    then, the branches that existed then under their names then, archived or live as they were
    then); ``replay``: that state already read (``collab.selectors.replay.replay_state``)."""
    sid = session.pk
    if replay is None and at is not None:
        replay = replay_state(session, at)
    at = replay.at if replay is not None else None
    first_at = Message.objects.filter(branch=OuterRef("pk")).order_by("depth", "created_at").values("created_at")[:1]
    branches = list(
        Branch.objects.filter(session_id=sid).select_related("tip", "forked_from")
        .only("id", "session_id", "name", "lane", "archived", "archived_at", "archive_reason", "created_at",
              "forked_from", "forked_from__branch_id", "forked_from__created_at", "tip", "tip__created_at",
              "tip__id")
        .annotate(first_at=Subquery(first_at))
    )
    upto = upto_time = None
    if replay is not None:  # the branches as they were then; those not created yet are left out
        branches = [then for b in branches if (then := replay.branch_then(b)) is not None]
        upto, upto_time = replay.messages(), replay.time
    by_id = {b.pk: b for b in branches}
    names = branch_labels((b.pk, b.display_name, b.forked_from.branch_id if b.forked_from else None) for b in branches)

    rows_qs = Message.objects.filter(session_id=sid).exclude(kind=MessageKind.ATTACH)
    if upto is not None:
        rows_qs = rows_qs.filter(pk__in=upto)
    limit = PAGE_ROWS
    cursor_id = before or since
    if cursor_id:
        cursor = Message.objects.filter(session_id=sid, pk=cursor_id).values_list("created_at", "id").first()
        if cursor is None:
            raise Invalid("no such message in this session", code="invalid_cursor")
        if before:
            rows_qs = rows_qs.filter(_before(cursor))
        else:
            rows_qs, limit = rows_qs.filter(_at_or_after(cursor)), SINCE_MAX_ROWS
    fetched = list(
        rows_qs.defer("text").annotate(snippet=Substr("text", 1, SNIPPET)).order_by("-created_at", "-id")[: limit + 1]
    )
    has_older = len(fetched) > limit
    if since and has_older:  # the live block grew past its bound: the newest page, with a link to the rows before it
        return dag_page(session, viewer, at=at, selected=selected)
    rows = fetched[:limit][::-1]
    if since:
        has_older = False  # the live block carries no "load older" link: the page above it keeps its own
    ids = [m.pk for m in rows]
    page_ids = set(ids)
    if rows:
        top, bottom = (rows[0].created_at, rows[0].pk), (rows[-1].created_at, rows[-1].pk)
    else:
        top = bottom = None

    # live lanes
    live: dict[str, str] = {}
    if replay is not None:
        live = replay.open_branches()
    else:
        for branch_id, status in Job.objects.open().filter(session_id=sid).order_by().values_list(
            "branch_id", "status"
        ):
            live[branch_id] = lane_state(status, live.get(branch_id))

    def lane_of(branch_id) -> int:
        b = by_id.get(branch_id)
        return b.lane if b else 0

    links: list[Link] = []
    external: dict[str, list] = {}  # session id → [(link kwargs, ...)] filled in after the visibility query

    # fork edges: from the fork point to the branch's first row
    in_page_first = {}
    for m in rows:
        in_page_first.setdefault(m.branch_id, m)
    for b in branches:
        if not b.forked_from_id or b.first_at is None or top is None:
            continue
        fork_in = b.forked_from_id in page_ids
        first = in_page_first.get(b.pk)
        first_in = first is not None and first.created_at <= b.first_at
        parent_branch = b.forked_from.branch_id if b.forked_from else None
        if fork_in and first_in:
            links.append(Link("fork", End(b.forked_from_id, parent_branch), End(first.pk, b.pk)))
        elif fork_in and (b.first_at, "") > bottom and (upto_time is None or b.first_at <= upto_time):
            links.append(Link("fork", End(b.forked_from_id, parent_branch), End(None, b.pk, "below")))
        elif first_in and b.forked_from and (b.forked_from.created_at, b.forked_from_id) < top:
            links.append(Link("fork", End(None, parent_branch, "above"), End(first.pk, b.pk)))

    # call edges: spawn (agent), task (agent to=…), message (send_message), explorer spawns
    if rows:
        calls = list(
            Job.objects.filter(Q(caller_msg_id__in=ids) | Q(prompt_msg_id__in=ids))
            .exclude(kind=JobKind.FOLLOWUP).exclude(prompt_msg__isnull=True).exclude(caller_msg__isnull=True)
            .order_by().values("id", "kind", "status", "session_id", "branch_id", "caller_session_id", "caller_msg_id",
                               "caller_branch_id", "prompt_msg_id", "branch__name")
        )
    else:
        calls = []
    for job in calls:
        detail = job["kind"]
        src_here, dst_here = job["caller_session_id"] == sid, job["session_id"] == sid
        if upto is not None and dst_here and job["prompt_msg_id"] not in page_ids and not before:
            continue  # replay's newest page: the callee's first row is not written yet at event ``at``
        if src_here and dst_here:
            src = End(job["caller_msg_id"], job["caller_branch_id"], "row" if job["caller_msg_id"] in page_ids else "above")
            dst = End(job["prompt_msg_id"], job["branch_id"], "row" if job["prompt_msg_id"] in page_ids else "below")
            links.append(Link("spawn", src, dst, detail=detail))
        elif src_here and job["caller_msg_id"] in page_ids:
            external.setdefault(job["session_id"], []).append({
                "kind": "spawn", "src": End(job["caller_msg_id"], job["caller_branch_id"]), "dst": End(where="external"),
                "detail": detail, "verb": f"→ {detail} {job['branch__name']!r} in", "head": job["prompt_msg_id"],
                "branch": job["branch_id"]})
        elif dst_here and job["prompt_msg_id"] in page_ids:
            external.setdefault(job["caller_session_id"], []).append({
                "kind": "spawn", "src": End(where="external"), "dst": End(job["prompt_msg_id"], job["branch_id"]),
                "detail": detail, "verb": f"← {detail} from", "head": job["caller_msg_id"], "branch": job["caller_branch_id"]})

    # result edges: from the job's last row to where its result arrived (mailbox or follow-up turn)
    arrivals = {}
    for m in rows:
        meta = m.metadata if isinstance(m.metadata, dict) else {}
        debt = meta.get("result_of") or meta.get("followup_of")
        if debt and m.kind in (MessageKind.AGENT_MESSAGE, MessageKind.NOTICE, MessageKind.FOLLOWUP):
            arrivals.setdefault(str(debt), m)
    page_jobs = {m.job_id for m in rows if m.job_id}
    debts = []
    if arrivals or page_jobs:
        last_row = (Message.objects.filter(job=OuterRef("pk")).exclude(kind=MessageKind.ATTACH)
                    .order_by("-created_at", "-id").values("id")[:1])
        debts = list(
            Job.objects.filter(Q(pk__in=list(arrivals)) | Q(pk__in=page_jobs, followup_state=FollowupState.DELIVERED))
            .annotate(last_msg=Subquery(last_row)).order_by()
            .values("id", "status", "session_id", "branch_id", "caller_session_id", "caller_branch_id", "last_msg")
        )
    result_label = {}
    for debt in debts:
        arrival = arrivals.get(debt["id"])
        if arrival is not None:
            who = names[debt["branch_id"]] if debt["session_id"] == sid and debt["branch_id"] in names else ""
            result_label[arrival.pk] = f"result{' from ' + who if who else ''}: {debt['status']}"
    leaving = {}
    for debt in debts:
        arrival = arrivals.get(debt["id"])
        last = debt["last_msg"]
        if arrival is not None:
            if debt["session_id"] == sid:
                if last is None:
                    continue
                src = End(last, debt["branch_id"], "row" if last in page_ids else "above")
                links.append(Link("result", src, End(arrival.pk, arrival.branch_id), detail=debt["status"]))
            else:
                external.setdefault(debt["session_id"], []).append({
                    "kind": "result", "src": End(where="external"), "dst": End(arrival.pk, arrival.branch_id),
                    "detail": debt["status"], "verb": "← result from", "head": last, "branch": debt["branch_id"]})
        elif last in page_ids and debt["session_id"] == sid:
            if debt["caller_session_id"] == sid:
                leaving[debt["id"]] = debt
            elif debt["caller_session_id"]:
                external.setdefault(debt["caller_session_id"], []).append({
                    "kind": "result", "src": End(last, debt["branch_id"]), "dst": End(where="external"),
                    "detail": debt["status"], "verb": "→ result to", "head": None, "branch": debt["caller_branch_id"]})
    if leaving and bottom is not None and (before or at is not None):  # the newest page has nothing below it
        keys = list(leaving)
        below = (
            Message.objects.filter(session_id=sid).filter(_at_or_after(bottom)).exclude(pk__in=page_ids)
            .filter(Q(metadata__result_of__in=keys) | Q(metadata__followup_of__in=keys))
        )
        if upto is not None:
            below = below.filter(pk__in=upto)
        for m in below.values("id", "branch_id", "metadata"):
            meta = m["metadata"] or {}
            debt = leaving.get(str(meta.get("result_of") or meta.get("followup_of")))
            if debt:
                links.append(Link("result", End(debt["last_msg"], debt["branch_id"]),
                                  End(None, m["branch_id"], "below"), detail=debt["status"]))

    # other sessions: named only when the viewer may see them
    if external:
        seen = {s["id"]: s for s in visible_sessions(viewer).filter(pk__in=list(external)).values("id", "title", "task_name")}
        for other, items in external.items():
            shown = seen.get(other)
            for item in items:
                if shown:
                    title = shown["title"] or shown["task_name"] or other
                    query = f"?branch={item['branch']}" + (f"&head={item['head']}" if item["head"] else "")
                    card, href, ref = f"{item['verb']} {title}", reverse("collab:session", args=[other]) + query, other
                else:
                    verb = item["verb"].split(" ")[0] + " " + ("result" if item["kind"] == "result" else item["detail"])
                    card, href, ref = f"{verb} · another session", "", "hidden"
                links.append(Link(item["kind"], item["src"], item["dst"], detail=item["detail"], card=card,
                                  card_href=href, ref=ref))

    # lanes
    url = reverse("collab:session", args=[sid])
    page_branches = {m.branch_id for m in rows}
    lanes = []
    for b in branches:
        archived = b.archived  # as it was then, in a replay (``Replay.branch_then``)
        above = b.first_at is not None and top is not None and b.first_at < top[0]
        below = bool(b.tip_id and bottom is not None and (b.tip.created_at, b.tip_id) > bottom)
        if upto is not None and not before:
            below = False  # replay's newest page ends at event ``at``
        if upto_time is not None and (b.first_at is None or b.first_at > upto_time):
            continue  # replay: this branch has no row yet
        if b.pk not in page_branches and not (above and below):
            continue
        lanes.append(Lane(b.pk, b.lane, names[b.pk], archived, b.archive_reason if archived else "",
                          live.get(b.pk, ""), above, below))
    labels, _ = redact_texts(viewer, [result_label.get(m.pk) or row_label(m) for m in rows], own=sid)
    stay = f"&at={at}" if at is not None else ""  # a node of a replay opens its branch in the replay
    graph_rows = [
        Row(m.pk, m.branch_id, m.role, m.kind, label,
            f"{label}\n{names.get(m.branch_id, '')} · {m.role}"
            f"{'' if m.kind == 'normal' else ' · ' + m.kind} · {m.created_at:%Y-%m-%d %H:%M:%S}",
            f"{url}?branch={m.branch_id}&head={m.pk}{stay}")
        for m, label in zip(rows, labels)
    ]
    graph = layout(graph_rows, lanes, links)
    waiting, asks = {}, []
    if replay is None and rows and WAITING in live.values():  # a replay shows what was, not what to decide
        waiting, asks = asks_at_rows(viewer, sid, ids)
    graph.nodes_svg = nodes_svg(graph.nodes, selected, waiting)
    return {"graph": graph, "rows": len(rows), "older": rows[0].pk if rows and has_older else None,
            "first": rows[0].pk if rows else None, "at": at, "session": session, "asks": asks}


_NODE = (
    '<a class="{cls}" href="{href}" data-node="{id}" data-lane="{lane}" data-branch="{branch}"{extra}>'
    '<title>{title}</title>{rings}<circle class="dot" cx="{x}" cy="{y}" r="{r}"/>'
    '<text class="label" x="{label_x}" y="{ty}">{label}</text></a>'
)
_CARD = '<a class="card edge-{kind}" href="{href}" data-card="{kind}"><text x="{x}" y="{y}">{text}</text></a>'
_HIDDEN_CARD = '<g class="card hidden edge-{kind}" data-card="{kind}"><text x="{x}" y="{y}">{text}</text></g>'


def nodes_svg(nodes: list[dict], selected: str | None = None, waiting: dict | None = None):
    """The nodes' SVG, built with ``format_html`` (every value escaped): one row's markup costs a
    few microseconds here against a few hundred in the template engine, which a 150-row page feels.
    ``waiting``: ``{row id: {"ask", "kind", "yours"}}``, the rows whose tool call waits for a
    person — marked, and described by their controls below the graph when ``yours``."""
    waiting = waiting or {}
    parts = []
    for n in nodes:
        ask = waiting.get(n["id"])
        cls = ["node", f"c{'fold' if n['folded'] else n['lane']}", f"role-{n['role']}", f"kind-{n['kind']}"]
        cls += [name for name, on in (("archived", n["archived"]), ("fork-point", n["fork_point"]),
                                      ("live", n["live"]), ("selected", n["id"] == selected),
                                      ("waiting", ask is not None)) if on]
        extra = format_html_join("", ' {}="{}"', [(k, v) for k, v in (
            ("data-fork-point", "1" if n["fork_point"] else ""), ("data-live", n["live"]),
            ("data-folded", "1" if n["folded"] else ""), ("data-ask", ask["ask"] if ask else ""),
            ("aria-describedby", f"dag-ask-{ask['ask']}" if ask and ask["yours"] else "")) if v])
        rings = format_html_join("", '<circle class="{}" cx="{}" cy="{}" r="{}"/>', [
            (name, n["x"], n["y"], r) for name, r, on in (("ring", 7, n["fork_point"]), ("pulse", 8, n["live"]),
                                                          ("wait", 9, ask is not None)) if on])
        title = n["title"] + (f" — archived{': ' + n['reason'] if n['reason'] else ''}" if n["archived"] else "")
        if ask is not None:
            title += " — waiting for a person" + (": decide it below the graph" if ask["yours"] else "")
        r = 2.5 if n["folded"] or n["role"] == "tool" else 4.5 if n["role"] == "user" else 3.5
        parts.append(format_html(_NODE, cls=" ".join(cls), href=n["href"], id=n["id"], lane=n["lane"],
                                 branch=n["branch"], extra=extra, title=title, rings=rings, x=n["x"], y=n["y"], r=r,
                                 label_x=n["label_x"], ty=n["y"] + 4, label=n["label"]))
        for c in n["cards"]:
            template = _CARD if c["card_href"] else _HIDDEN_CARD
            parts.append(format_html(template, kind=c["kind"], href=c["card_href"], x=c["card_x"], y=n["y"] + 4,
                                     text=c["card_text"]))
    return format_html_join("", "{}", ((part,) for part in parts))  # each part is already escaped markup


"""The session DAG's geometry: pure functions, no database, no Django.

The picture is git's ``log --graph`` turned into fixed columns: one row per message, oldest
at the top; every branch owns one *lane* (column) for life, chosen when it opens and stored
on the branch (``pick_lane``), so a new message only ever appends a row — nothing above it
moves. Git's ``graph.c`` re-packs its columns on every row (a column exists while a commit
waits for its parent); here a lane is reused only after its branch can write no more rows
(archived and idle), which keeps every row of a branch in one column.

Lanes at or beyond ``LANE_CAP`` fold into one last column labelled "+N".
``layout`` takes one page of rows plus what the selector found about the lanes and the
edges touching that page, and answers coordinates; the template only draws them.
"""

from dataclasses import dataclass, field

LANE_CAP = 8
ROW_H = 22
LANE_W = 16
PAD_X = 10
PAD_Y = 8
LABEL_GAP = 12
CHAR_W = 6.7  # the labels' monospace advance at 11 px
STUB = 6  # how far an edge to an off-page endpoint reaches past the page edge (inside the margin)


def pick_lane(occupied, parent_lane: int | None) -> int:
    """The free lane nearest ``parent_lane`` (the parent's own lane if it is free; on a tie
    the one to the right, so children open beside their parent). No parent: the lowest free lane."""
    taken = set(occupied)
    if parent_lane is None:
        parent_lane = 0
    for distance in range(len(taken) + parent_lane + 2):
        for lane in (parent_lane + distance, parent_lane - distance):
            if lane >= 0 and lane not in taken:
                return lane
    return max(taken, default=-1) + 1  # unreachable: the loop above always finds a gap


@dataclass(frozen=True)
class Row:
    """One message of the page, in display order (oldest first)."""

    id: str
    branch: str
    role: str = "user"
    kind: str = "normal"
    label: str = ""
    title: str = ""
    href: str = ""


@dataclass(frozen=True)
class Lane:
    """A branch as the page sees it. ``open_above``/``open_below``: the branch has rows (or a
    fork point, for ``open_above``) before the page's first row / after its last one."""

    branch: str
    lane: int
    name: str = ""
    archived: bool = False
    reason: str = ""
    live: str = ""  # "", "queued", "running" or "waiting for a person" (collab.selectors.replay.lane_state)
    open_above: bool = False
    open_below: bool = False


@dataclass(frozen=True)
class End:
    """One end of an edge: a row of the page (``node``), or a lane of this session above or
    below the page (``node`` None, ``where`` "above"/"below"), or another session (``where``
    "external": drawn as a port at the right of the lanes beside the other end's row)."""

    node: str | None = None
    branch: str | None = None
    where: str = "row"


@dataclass(frozen=True)
class Link:
    kind: str  # fork | spawn | result
    src: End
    dst: End
    detail: str = ""  # spawn | task | message for a call edge; the job's status for a result
    card: str = ""  # the external side's text (empty when the viewer may not see it: "another session")
    card_href: str = ""
    ref: str = ""  # the external side's id for data-to/data-from (message address or "hidden")


@dataclass
class Graph:
    width: int
    height: int
    lanes_width: int
    nodes: list = field(default_factory=list)
    segments: list = field(default_factory=list)
    edges: list = field(default_factory=list)
    folded: int = 0
    fold_x: int = 0
    nodes_svg: str = ""  # the nodes' markup, filled in by the selector (collab.selectors.dag.nodes_svg)


def column(lane: int, cap: int = LANE_CAP) -> int:
    return min(lane, cap)


def x_of(col: int) -> int:
    return PAD_X + col * LANE_W


def y_of(index: int) -> int:
    return PAD_Y + index * ROW_H + ROW_H // 2


def _curve(x1, y1, x2, y2) -> str:
    """A vertical S-curve from (x1, y1) to (x2, y2); a straight line when the columns match."""
    if x1 == x2:
        return f"M{x1},{y1} L{x2},{y2}"
    if y2 - y1 <= ROW_H * 1.5:
        mid = (y1 + y2) / 2
        return f"M{x1},{y1} C{x1},{mid:g} {x2},{mid:g} {x2},{y2}"
    bend = y1 + ROW_H  # leave the source's lane at once, then run down the target's lane
    return f"M{x1},{y1} C{x1},{y1 + ROW_H // 2} {x2},{y1 + ROW_H // 2} {x2},{bend} L{x2},{y2}"


def layout(rows: list[Row], lanes: list[Lane], links: list[Link], *, cap: int = LANE_CAP,
           label_chars: int = 48) -> Graph:
    """Coordinates for one page: nodes, lane segments, edges and the fold column."""
    by_branch = {lane.branch: lane for lane in lanes}
    index = {row.id: i for i, row in enumerate(rows)}
    height = PAD_Y * 2 + ROW_H * max(len(rows), 1)
    first_row, last_row = {}, {}
    for i, row in enumerate(rows):
        first_row.setdefault(row.branch, i)
        last_row[row.branch] = i

    def col(branch):
        lane = by_branch.get(branch)
        return column(lane.lane if lane else 0, cap)

    shown = [lane for lane in lanes if lane.branch in first_row or (lane.open_above and lane.open_below)]
    folded = sorted({lane.branch for lane in shown if lane.lane >= cap})
    cols = {column(lane.lane, cap) for lane in shown}
    lanes_width = PAD_X * 2 + LANE_W * (max(cols, default=0))
    graph = Graph(width=0, height=height, lanes_width=lanes_width, folded=len(folded), fold_x=x_of(cap))

    # lane segments: from its first row on the page (or the top) to its last (or the bottom)
    for lane in shown:
        if lane.lane >= cap:
            continue  # folded lanes are drawn as nodes only: a shared column has no one line
        top = y_of(first_row[lane.branch]) if lane.branch in first_row and not lane.open_above else 0
        bottom = y_of(last_row[lane.branch]) if lane.branch in last_row and not lane.open_below else height
        if bottom <= top:
            continue
        graph.segments.append({
            "branch": lane.branch, "lane": lane.lane, "x": x_of(lane.lane), "y1": top, "y2": bottom,
            "name": lane.name, "archived": lane.archived, "reason": lane.reason, "live": lane.live,
        })

    forked_at = {link.src.node for link in links if link.kind == "fork" and link.src.where == "row"}
    for i, row in enumerate(rows):
        lane = by_branch.get(row.branch)
        c = col(row.branch)
        is_first = first_row.get(row.branch) == i and not (lane and lane.open_above)
        is_last = last_row.get(row.branch) == i and not (lane and lane.open_below)
        graph.nodes.append({
            "id": row.id, "branch": row.branch, "lane": lane.lane if lane else 0, "x": x_of(c), "y": y_of(i),
            "role": row.role, "kind": row.kind, "href": row.href, "title": row.title,
            "label": _clip((f"{lane.name} · " if is_first and lane and lane.name else "") + row.label, label_chars), "name": lane.name if lane else "",
            "first": is_first, "fork_point": row.id in forked_at, "folded": bool(lane and lane.lane >= cap),
            "archived": bool(lane and lane.archived), "reason": lane.reason if lane else "",
            "live": (lane.live if lane and is_last else ""), "cards": [],
        })

    ext_x = lanes_width + 2
    for link in links:
        points = []
        for end, other in ((link.src, link.dst), (link.dst, link.src)):
            if end.where == "row" and end.node in index:
                points.append((x_of(col(end.branch)), y_of(index[end.node])))
            elif end.where == "above":
                points.append((x_of(col(end.branch)), -STUB + PAD_Y))
            elif end.where == "below":
                points.append((x_of(col(end.branch)), height - PAD_Y + STUB))
            elif end.where == "external" and other.node in index:
                points.append((ext_x, y_of(index[other.node])))
            else:
                points.append(None)
        if None in points or not (link.src.node in index or link.dst.node in index):
            continue  # an end is nowhere to be drawn, or the edge touches no row of this page
        (x1, y1), (x2, y2) = points
        external = "external" in (link.src.where, link.dst.where)
        if external:
            path = f"M{x1},{y1} L{x2},{y2}"
        else:
            path = _curve(x1, y1, x2, y2)
        graph.edges.append({
            "kind": link.kind, "detail": link.detail, "path": path, "external": external,
            "from": link.src.node or (link.ref if link.src.where == "external" else ""),
            "to": link.dst.node or (link.ref if link.dst.where == "external" else ""),
            "from_where": link.src.where, "to_where": link.dst.where,
            "card": link.card, "card_href": link.card_href, "port_x": ext_x,
            "port_y": y1 if link.dst.where == "external" else y2,
        })
    nodes = {node["id"]: node for node in graph.nodes}
    for edge in graph.edges:
        if edge["external"]:
            row = edge["from"] if edge["from_where"] == "row" else edge["to"]
            nodes[row]["cards"].append(edge)
    widest = 0
    for node in graph.nodes:
        node["label_x"] = lanes_width + LABEL_GAP
        x = node["label_x"] + int(CHAR_W * len(node["label"])) + LABEL_GAP
        for card in node["cards"]:
            card["card_x"] = x
            card["card_text"] = _clip(card["card"] or "another session", label_chars)
            x += int(CHAR_W * len(card["card_text"])) + LABEL_GAP
        widest = max(widest, x)
    graph.width = max(widest, lanes_width + LABEL_GAP + int(CHAR_W * label_chars))
    return graph


def _clip(text: str, n: int) -> str:
    """A one-line label of at most ``n`` characters for the graph, cut at a word's end with an
    ellipsis (a single word longer than half of it is cut where it must be). The whole text is
    the node's title (its tooltip and accessible name): this is no bound on content."""
    text = " ".join((text or "").split())
    if len(text) <= n:
        return text
    cut = text[: n - 1]
    if text[n - 1] != " ":  # the cut falls inside a word: end at the last whole one
        space = cut.rfind(" ")
        if space >= n // 2:
            cut = cut[:space]
    return cut.rstrip(" ,;:.·-—→") + "…"

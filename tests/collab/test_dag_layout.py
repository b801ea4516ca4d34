"""The DAG's geometry, without a database: lanes for life, forks, edges, the fold."""

from collab.dag_layout import (
    LANE_CAP,
    ROW_H,
    End,
    Lane,
    Link,
    Row,
    layout,
    pick_lane,
    x_of,
    y_of,
)


def test_a_new_lane_is_the_free_one_nearest_its_parents():
    assert pick_lane(set(), None) == 0
    assert pick_lane({0}, None) == 1
    assert pick_lane({0}, 0) == 1  # beside its parent, to the right
    assert pick_lane({0, 1, 2}, 1) == 3
    assert pick_lane({0, 2, 3}, 2) == 1  # left is nearer than the next free on the right (4)
    assert pick_lane({1, 2}, 2) == 3  # a tie goes right
    assert pick_lane({0, 1}, 4) == 4  # the parent's own lane, freed (archived), is nearest of all
    assert pick_lane({0, 1, 3}, 1) == 2


def _rows(*specs):
    return [Row(id=i, branch=b, role=r, label=f"{r}: text") for i, b, r in specs]


def test_one_row_per_message_each_branch_in_its_own_column_oldest_on_top():
    rows = _rows(("m1", "main", "user"), ("m2", "main", "assistant"), ("f1", "fork", "user"), ("m3", "main", "user"))
    lanes = [Lane("main", 0, "main"), Lane("fork", 1, "fork")]
    g = layout(rows, lanes, [Link("fork", End("m1", "main"), End("f1", "fork"))])
    nodes = {n["id"]: n for n in g.nodes}
    assert [n["id"] for n in g.nodes] == ["m1", "m2", "f1", "m3"]
    assert [nodes[i]["y"] for i in ("m1", "m2", "f1", "m3")] == [y_of(0), y_of(1), y_of(2), y_of(3)]
    assert nodes["f1"]["x"] == x_of(1) and nodes["m3"]["x"] == x_of(0)
    assert nodes["m1"]["fork_point"] and not nodes["m2"]["fork_point"]
    assert nodes["f1"]["first"] and nodes["f1"]["label"].startswith("fork · ")
    (edge,) = g.edges
    assert edge["kind"] == "fork" and edge["from"] == "m1" and edge["to"] == "f1"
    assert edge["path"].startswith(f"M{x_of(0)},{y_of(0)} ") and edge["path"].endswith(f"{x_of(1)},{y_of(2)}")
    # main's line runs from its first to its last row; the fork's is one row (no segment)
    segs = {s["branch"]: s for s in g.segments}
    assert (segs["main"]["y1"], segs["main"]["y2"]) == (y_of(0), y_of(3))
    assert "fork" not in segs


def test_rows_appended_below_never_move_the_rows_above():
    lanes = [Lane("main", 0, "main"), Lane("b", 2, "b")]
    before = layout(_rows(("m1", "main", "user"), ("b1", "b", "user")), lanes, [])
    after = layout(_rows(("m1", "main", "user"), ("b1", "b", "user"), ("m2", "main", "assistant"),
                         ("b2", "b", "assistant")), lanes, [])
    first = {n["id"]: (n["x"], n["y"]) for n in before.nodes}
    assert {i: xy for i, xy in ((n["id"], (n["x"], n["y"])) for n in after.nodes) if i in first} == first


def test_open_lanes_run_off_the_page_and_off_page_ends_become_stubs():
    rows = _rows(("a", "main", "user"), ("b", "kid", "user"))
    lanes = [Lane("main", 0, "main", open_above=True, open_below=True), Lane("kid", 1, "kid", open_below=True),
             Lane("through", 2, "through", open_above=True, open_below=True), Lane("gone", 3, "gone")]
    links = [Link("spawn", End(None, "main", "above"), End("b", "kid")),
             Link("result", End("b", "kid"), End(None, "main", "below")),
             Link("fork", End(None, "x", "above"), End(None, "y", "below"))]  # touches no row: not drawn
    g = layout(rows, lanes, links)
    segs = {s["branch"]: (s["y1"], s["y2"]) for s in g.segments}
    assert segs["main"] == (0, g.height)
    assert segs["kid"] == (y_of(1), g.height)
    assert segs["through"] == (0, g.height)  # no row on this page, but open on both sides
    assert "gone" not in segs
    assert [(e["kind"], e["from"], e["to"]) for e in g.edges] == [("spawn", "", "b"), ("result", "b", "")]
    assert g.edges[0]["from_where"] == "above" and g.edges[1]["to_where"] == "below"


def test_archived_lanes_carry_their_reason_and_live_lanes_mark_their_last_row():
    rows = _rows(("a1", "a", "user"), ("b1", "b", "user"), ("b2", "b", "assistant"), ("a2", "a", "assistant"))
    lanes = [Lane("a", 0, "a", archived=True, reason="done with it"), Lane("b", 1, "b", live="running")]
    g = layout(rows, lanes, [])
    nodes = {n["id"]: n for n in g.nodes}
    assert nodes["a1"]["archived"] and nodes["a1"]["reason"] == "done with it"
    assert [n["id"] for n in g.nodes if n["live"]] == ["b2"]
    segs = {s["branch"]: s for s in g.segments}
    assert segs["a"]["archived"] and segs["a"]["reason"] == "done with it" and segs["b"]["live"] == "running"


def test_lanes_past_the_cap_fold_into_one_column_counted_as_plus_n():
    n = LANE_CAP + 3
    rows = _rows(*[(f"m{i}", f"b{i}", "user") for i in range(n)])
    lanes = [Lane(f"b{i}", i, f"b{i}") for i in range(n)]
    g = layout(rows, lanes, [Link("spawn", End("m0", "b0"), End(f"m{n - 1}", f"b{n - 1}"))])
    assert g.folded == 3  # lanes cap, cap+1 and cap+2 share the last column
    folded = [node for node in g.nodes if node["folded"]]
    assert len(folded) == 3 and {node["x"] for node in folded} == {x_of(LANE_CAP)}
    assert max(node["x"] for node in g.nodes) == x_of(LANE_CAP)
    assert g.edges[0]["path"].endswith(f"{x_of(LANE_CAP)},{y_of(n - 1)}")
    assert g.lanes_width < x_of(LANE_CAP + 2)


def test_an_external_end_is_a_card_beside_its_row():
    rows = _rows(("a", "main", "assistant"), ("r", "main", "user"))
    links = [Link("spawn", End("a", "main"), End(where="external"), detail="spawn", card="→ spawn 'x' in Other",
                  card_href="/s/other/?branch=b", ref="other"),
             Link("result", End(where="external"), End("r", "main"), card="", ref="hidden")]
    g = layout(rows, [Lane("main", 0, "main")], links)
    nodes = {n["id"]: n for n in g.nodes}
    (out,), (back,) = nodes["a"]["cards"], nodes["r"]["cards"]
    assert out["card_text"] == "→ spawn 'x' in Other" and out["card_href"] == "/s/other/?branch=b"
    assert out["to"] == "other" and out["from"] == "a"
    assert back["card_text"] == "another session" and back["card_href"] == "" and back["from"] == "hidden"
    assert out["card_x"] > nodes["a"]["label_x"] and g.width >= out["card_x"]
    assert ROW_H > 0

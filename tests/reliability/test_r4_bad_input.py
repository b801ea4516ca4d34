"""R4 (docs/contract.md#http-api): bad input on every route of the OpenAPI
schema → 0 answers 5xx, and every 4xx JSON answer carries ``{"detail", "code"}``.

The routes are not listed by hand: each operation of ``/api/openapi.json`` is probed, with its path
parameters filled with real ids (or junk), and gets:

- path and query parameters: NUL, a lone surrogate, 5,000 characters, a 400-digit number (a huge
  ``after=``), ``-1``, ``NaN``, ``Infinity``, ``1e400``, a word where a number is expected, an
  unknown parameter;
- bodies: malformed JSON (truncated, bare words, a NUL byte, invalid UTF-8), JSON of the wrong
  shape (array, string, number, null, empty), 10,000 levels of nesting, unknown fields, every
  property in turn with each wrong type, NUL and a lone surrogate in every string property,
  ``Infinity`` and ``1e400`` as numbers, and a 10 MB body (a 10 MB string in a valid body, and
  10 MB of junk).

In-process through the full middleware and URL stack, as the route's owner (who may call every
route), on the database under test. In CI each route and field gets a rotating share of each
kind of probe (every probe is still sent to some route); ``TRELLIS_RELIABILITY_FULL=1`` sends all
of them everywhere.
"""

import json
from urllib.parse import quote


from tests.collab.test_bad_input import answer, world  # noqa: F401 (fixture)
from tests.reliability.conftest import FULL

NUL, SURROGATE = "\x00", "\ud800"
TEN_MB = 10 * 1024 * 1024
JUNK_PATH = ["%00", "a%00b", "%ED%A0%80", "x" * 5000, "9" * 400, "-1", "..%2F.."]
JUNK_QUERY = [NUL, SURROGATE, "x" * 5000, "9" * 400, "-1", "NaN", "Infinity", "1e400", "abc", ""]
WRONG_TYPES = [None, 0, -1, 1.5, "s", "", [], {}, True, "9" * 400]
MALFORMED = [b"{", b'{"a":', b"nul", b"[1,", b"{'a': 1}", b"\x00", b'{"a": "\xff\xfe"}', b"\xff" * 10, b"{}}",
             b'{"a": NaN}', b'{"a": Infinity}', b'{"a": 1e400}', b'{"a": -1e400}']
WRONG_SHAPE = [b"[]", b'"s"', b"1", b"null", b"", b"true", b"[{}]"]


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    for key in ("anyOf", "allOf", "oneOf"):
        if key in node:
            options = [_resolve(schema, n) for n in node[key] if n.get("type") != "null"]
            if options:
                return options[0]
    return node


def _example(schema: dict, node: dict, depth: int = 0):
    node = _resolve(schema, node)
    kind = node.get("type")
    if "enum" in node:
        return node["enum"][0]
    if kind == "object" or "properties" in node:
        if depth > 3:
            return {}
        props = node.get("properties", {})
        return {name: _example(schema, props[name], depth + 1) for name in node.get("required", [])}
    if kind == "array":
        return [] if depth > 3 else [_example(schema, node.get("items", {}), depth + 1)]
    return {"integer": 1, "number": 1, "boolean": True, "string": "x"}.get(kind, "x")


def some(probes, n: int, k: int) -> list:
    """All of ``probes`` at full size; in CI ``k`` of them, a different ``k`` for each ``n`` (each
    route and field gets some of every kind of probe, and the suite as a whole gets them all)."""
    if FULL:
        return list(probes)
    return [probes[(n * k + i) % len(probes)] for i in range(min(k, len(probes)))]


def _bodies(schema: dict, op: dict, seed: int) -> list[bytes]:
    """Every bad body for ``op``: malformed, wrong shape, deep, unknown fields, wrong types, bad text, huge."""
    content = (op.get("requestBody") or {}).get("content", {}).get("application/json")
    if content is None:
        return []
    node = _resolve(schema, content["schema"])
    valid = _example(schema, node)
    out = some(MALFORMED, seed, 4) + some(WRONG_SHAPE, seed, 2)
    out.append(b"[" * 10_000 + b"]" * 10_000)
    out.append(b'{"a":' * 10_000 + b"1" + b"}" * 10_000)
    if isinstance(valid, dict):
        out.append(json.dumps({**valid, "unknown_field": 1}).encode())
        props = node.get("properties", {})
        for n, name in enumerate(props):
            if not FULL and n % 2 != seed % 2:
                continue  # in CI every other field (the next route takes the others)
            for wrong in some(WRONG_TYPES, n + seed, 2):
                out.append(json.dumps({**valid, name: wrong}).encode())
            for text in some((NUL, SURROGATE, f"a{NUL}b{SURROGATE}c"), n + seed, 1):
                out.append(json.dumps({**valid, name: text}).encode())
            for literal in some(("Infinity", "1e400", "-1e400", "NaN"), n + seed, 1):
                out.append(json.dumps({**valid, name: 0}).replace(f'"{name}": 0', f'"{name}": {literal}').encode())
        first_text = next((n for n, p in props.items() if _resolve(schema, p).get("type") == "string"), "unknown_field")
        huge = json.dumps({**valid, first_text: "x" * TEN_MB}).encode()
    else:
        huge = json.dumps([valid[0]] * 2 + [None, 1, "s"]).encode()
        out.append(huge)
    out += [huge, b"z" * TEN_MB] if FULL else [(huge, b"z" * TEN_MB)[seed % 2]]
    return out


def _path_values(w, team) -> dict[str, str]:
    from accounts.models import ApiToken

    token = ApiToken.objects.filter(user=team.owner).values_list("pk", flat=True).first()
    return {"slug": "alpha", "sid": w.sid, "execution_id": w.eid, "address": w.address, "tool": "todo_list",
            "username": "viewer", "token_id": str(token), "invitation_id": "1", "hold_id": "1", "artifact_id": "a1",
            "webhook_id": "1", "item_id": "0123456789ab"}


def _fill(path: str, values: dict[str, str], junk: tuple[str, str] | None = None) -> str:
    for name, value in values.items():
        if junk and junk[0] == name:
            value = junk[1]
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, f"no value for a path parameter of {path}"
    return path


def test_bad_input_on_every_openapi_route_is_never_a_5xx(world, team, figure):
    owner = world.owner
    client, headers = owner.client, owner.headers
    r = owner.get("/api/openapi.json")
    assert r.status_code == 200
    schema = r.json()
    values = _path_values(world, team)
    requests = operations = 0
    statuses: dict[int, int] = {}

    def send(method: str, path: str, body: bytes | None = None):
        nonlocal requests
        call = getattr(client, method)
        if body is None:
            r = call(path, **headers)
        else:
            r = call(path, body, content_type="application/json", **headers)
        requests += 1
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        answer(r)  # never a 5xx; a 4xx JSON answer has detail and code
        if r.status_code >= 400:  # and an API route answers JSON, never an HTML error page
            assert r["Content-Type"].startswith("application/json"), (method, path[:200], r.status_code, r.content[:200])
        return r

    for template, ops in schema["paths"].items():
        names = [p.strip("{}") for p in template.split("/") if p.startswith("{")]
        for method, op in ops.items():
            operations += 1
            for name in names:  # junk in each path parameter
                for junk in some(JUNK_PATH, operations, 2):
                    send(method, _fill(template, values, (name, junk)), b"{}" if method != "get" else None)
            if method == "delete":
                continue  # a valid path would really delete; its junk paths are probed above
            path = _fill(template, values)
            query = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
            for name in query + ["unknown_parameter"]:
                for junk in some(JUNK_QUERY, operations + len(name), 3):
                    send(method, f"{path}?{name}={quote(junk.encode('utf-8', 'surrogatepass'))}",
                         b"{}" if method != "get" else None)
            for body in _bodies(schema, op, operations):
                send(method, path, body)
    figure(f"R4: {operations} operations, {requests} bad requests, answers {dict(sorted(statuses.items()))}, "
           f"{sum(n for s, n in statuses.items() if s >= 500)} 5xx")
    assert operations >= 30 and requests > (1000 if FULL else 300)

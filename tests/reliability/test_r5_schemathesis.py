"""R5 (docs/contract.md#http-api): schemathesis against ``/api/openapi.json`` with two users and
every check → 0 answers 5xx, 0 conformance failures.

The schema is the one the server publishes; schemathesis generates requests for every operation
from it — positive (what the schema allows) and negative (what it forbids) — and runs each through
the Django application in-process (WSGI), once as a member of project ``alpha`` and once as an
outsider who owns project ``beta``. Path parameters are the member's real ids (a session, its
execution, its branch address, the project) as often as generated ones, so the routes are reached
past their 404s. Every response goes through all of schemathesis's checks: no server error, status
code, content type, headers and body conforming to the schema, negative data rejected, positive
data accepted, and the rest of its registry.

Examples per operation: ``EXAMPLES`` (CI 8, full 100).

"Positive data is accepted" (ST202) holds because the published schema states the rules the
services enforce on valid-looking input (``collab/schemas.py``): a prompt that is not blank, the
commands' one action and empty payload, the choices of every enumerated field, the limits'
bounds and ceilings, an agent script's shape, a webhook URL's syntax, a seq's text. A few
refusals of schema-valid input depend on the server's state or the time, not on the request,
and no schema can state them; each is listed in ``STATE_DEPENDENT`` with its reason and is
accepted from that operation only, with that error code only (schemathesis's own defaults
already accept 401/403/404/409/429 for such cases: a random id, a busy branch, a quota).
The pinned execution is cancelled before the run: an event stream of an execution that never
ends (no worker runs here) would never end under WSGI, which reads a streamed body whole.
"""

import pytest
from hypothesis import HealthCheck, Phase, given, settings as hypothesis_settings
from hypothesis import strategies as st

from tests.reliability.conftest import size

EXAMPLES = size(8, 100)

# (operation, error code) → why a schema-valid request may be refused with that 400
STATE_DEPENDENT = {
    ("POST /api/projects/{slug}/agent-specs", "provider_config"):
        "the model connections the operator made available to the project (none here)",
    ("POST /api/projects/{slug}/webhooks", "webhook_host_not_allowed"):
        "the operator's webhook hosts (TRELLIS_WEBHOOK_HOSTS, none here)",
    ("PATCH /api/webhooks/{webhook_id}", "webhook_host_not_allowed"):
        "the operator's webhook hosts (TRELLIS_WEBHOOK_HOSTS, none here)",
    ("POST /api/tokens", "invalid_expiry"): "a moment in the future: the schema cannot say 'after now'",
    ("POST /api/sessions/{sid}/shares", "share_role_too_wide"): "the named member's role in the project",
    ("PUT /api/sessions/{sid}/shares", "share_role_too_wide"): "the named member's role in the project",
    ("POST /api/sessions/{sid}/turns", "archived"): "the branch was archived (by an earlier call of the run)",
}


def positive_data_accepted_unless_state_dependent(ctx, response, case):
    """schemathesis's "positive data is accepted" (ST202), except a 400 listed in ``STATE_DEPENDENT``."""
    from schemathesis.openapi.checks import RejectedPositiveData
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        try:
            code = response.json().get("code")
        except Exception:  # not the API's error shape: the failure stands
            code = None
        if response.status_code == 400 and (case.operation.label, code) in STATE_DEPENDENT:
            return None
        raise


def negative_data_rejected_unless_after_is_ignored(ctx, response, case):
    """schemathesis's "negative data is rejected" (ST201), except on the event stream when a valid
    ``Last-Event-ID`` header came with it: the stream resumes from the header and ``?after=`` is
    not read (the SSE rule, ``collab.streams._resume_point``), which no schema can say."""
    import re

    from schemathesis.specs.openapi.checks import negative_data_rejection

    from collab.streams import SEQ_TEXT

    try:
        return negative_data_rejection(ctx, response, case)
    except Exception:
        resumed = (case.headers or {}).get("Last-Event-ID")
        if (case.operation.label == "GET /api/executions/{execution_id}/stream" and isinstance(resumed, str)
                and re.search(SEQ_TEXT.json_schema["pattern"], resumed) and response.status_code == 200):
            return None
        raise


@pytest.fixture
def ids(transactional_db, team, api_as):
    """The member's session with an ended turn (cancelled while queued, so its stream ends), its
    address, and both users' tokens. Transactional: the WSGI application closes the connection
    between requests, which a test wrapped in one transaction cannot survive."""
    from accounts.models import ApiToken, TokenScope

    owner, api = api_as(team.owner), api_as(team.member)
    assert owner.post("/api/projects/alpha/agent-specs", {"agent_id": "bot"}).status_code == 201
    sid = api.post("/api/projects/alpha/sessions", {"title": "s", "agent_id": "bot"}).json()["id"]
    eid = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
    version = api.get(f"/api/executions/{eid}").json()["version"]
    cancel = {"command_id": "r5", "action": "execution.cancel", "expected_version": version}
    # a worker of this run (the session's, once an earlier test started it) may have taken the
    # turn already: then the cancel is a stale version (409) or stops it; either way it ends
    assert api.post(f"/api/executions/{eid}/commands", cancel).status_code in (202, 409)
    assert api.wait(eid)["status"] in ("cancelled", "succeeded")
    head = api.get(f"/api/sessions/{sid}").json()["head"]
    issued = {who: ApiToken.issue(user, name="r5", scopes=TokenScope.values)
              for who, user in (("member", team.member), ("outsider", team.outsider))}
    return {"slug": "alpha", "sid": sid, "execution_id": eid, "address": f"{sid}:{head}",
            "tokens": {who: raw for who, (_, raw) in issued.items()}, "token_ids": [t.pk for t, _ in issued.values()]}


@pytest.mark.one_database("sqlite")  # the schema against the services; R4 probes bad input on both
@pytest.mark.timeout(180 + 12 * EXAMPLES)  # a hang guard: the full size (100 examples) runs ~11 minutes
def test_schemathesis_every_check_two_users_no_5xx_no_conformance_failure(ids, figure):
    import schemathesis
    from django.core.wsgi import get_wsgi_application
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    from accounts.models import ApiToken

    from schemathesis.specs.openapi.checks import negative_data_rejection

    # both run as the narrower versions above
    excluded = [positive_data_acceptance, negative_data_rejection]
    narrowed = [positive_data_accepted_unless_state_dependent, negative_data_rejected_unless_after_is_ignored]
    schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())
    failures, calls, operations = [], 0, 0

    def runner(operation, real):
        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                             phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def run(data):
            nonlocal calls
            mode = data.draw(st.sampled_from(["positive", "negative"]))
            pinned = real if real and data.draw(st.booleans()) else None
            case = data.draw(operation.as_strategy(
                generation_mode=schemathesis.GenerationMode(mode), path_parameters=pinned))
            for who, token in ids["tokens"].items():
                calls += 1
                try:
                    # a generated DELETE /api/tokens/{id} may hit one of these two: the run goes on as them
                    ApiToken.objects.filter(pk__in=ids["token_ids"]).update(revoked_at=None)
                    case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, excluded_checks=excluded,
                                           additional_checks=narrowed)
                except (Exception, BaseExceptionGroup) as exc:  # a failed check: recorded, the run goes on
                    failures.append(f"{who} {operation.label}: {str(exc)[:600]}")

        return run

    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        real = {p.name: ids[p.name] for p in operation.path_parameters if p.name in ids}
        try:
            runner(operation, real)()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis reports an operation's failed checks when its run ends
            causes = [repr(e)[:300] for e in getattr(exc, "exceptions", ())]  # what a flaky run first raised
            failures.append(f"{operation.label}: {str(exc)[:800]} {causes}")
    figure(f"R5: schemathesis, {operations} operations, {calls} calls as two users (every check), "
           f"{len(failures)} failures")
    assert failures == [], "\n".join(failures[:20])

"""The admin matrix: view-only staff look but never act; staff with
the Django permissions act, every edit and action through the service layer, each leaving an Event."""

from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from accounts.models import ApiToken, Membership, Project
from collab.models import AgentSpec, Branch, Event, ExecutionCommand, Job

MODELS = ["project", "membership", "apitoken", "agentspec", "session", "branch", "job", "todo", "event",
          "helddelivery", "message", "inboxentry", "artifact", "executioncommand"]


def staff(django_user_model, username, *actions):
    user = django_user_model.objects.create_user(username, password="pw-secret-123", is_staff=True)
    codenames = [f"{a}_{m}" for a in actions for m in MODELS]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames,
                                                        content_type__app_label__in=["accounts", "collab"]))
    client = Client()
    client.force_login(user)
    return user, client


@pytest.fixture
def looker(django_user_model):
    """Staff with the ``view_*`` permissions only."""
    return staff(django_user_model, "looker", "view")


@pytest.fixture
def operator(django_user_model):
    """Staff with view, add, change and delete permissions (not a superuser: the permissions decide)."""
    return staff(django_user_model, "operator", "view", "add", "change", "delete")


@pytest.fixture
def rows(team, scripted_session):
    """A session with a queued turn (no worker runs it), its branch, a spec, a token."""
    api, sid = scripted_session(team.member, [{"text": "x"}])
    job_id = api.post(f"/api/sessions/{sid}/turns", {"prompt": "hi"}).json()["execution_id"]
    token, _ = ApiToken.issue(team.member, name="laptop")
    return type("Rows", (), {"sid": sid, "job": Job.objects.get(pk=job_id), "branch": Branch.objects.get(session_id=sid),
                             "spec": AgentSpec.objects.get(project=team.alpha, agent_id="bot"), "token": token,
                             "membership": Membership.objects.get(project=team.alpha, user=team.viewer)})


def run_action(client, model_url, action, pk, **extra):
    return client.post(f"/admin/{model_url}/", {"action": action, "_selected_action": [pk], "index": 0, **extra})


ACTIONS = [
    # (admin url, action, row, event type, how the row shows it was done)
    ("collab/branch", "archive_branches", "branch", "branch.archived",
     lambda r: Branch.objects.get(pk=r.branch.pk).archived),
    ("collab/branch", "mark_internal", "branch", "branch.internal_changed",
     lambda r: Branch.objects.get(pk=r.branch.pk).internal),
    ("collab/job", "cancel_executions", "job", "execution.cancel_requested",
     lambda r: Job.objects.get(pk=r.job.pk).status == "cancelled" and ExecutionCommand.objects.filter(job=r.job).exists()),
    ("collab/agentspec", "delete_specs", "spec", "agent_spec.deleted",
     lambda r: not AgentSpec.objects.filter(pk=r.spec.pk).exists()),
    ("accounts/membership", "remove_members", "membership", "member.removed",
     lambda r: not Membership.objects.filter(pk=r.membership.pk).exists()),
    ("accounts/apitoken", "revoke_tokens", "token", "token.revoked",
     lambda r: ApiToken.objects.get(pk=r.token.pk).revoked_at is not None),
]


@pytest.mark.parametrize("url,action,row,event,done", ACTIONS, ids=[a[1] for a in ACTIONS])
def test_view_only_staff_cannot_run_an_admin_action(team, rows, looker, url, action, row, event, done):
    user, client = looker
    assert client.get(f"/admin/{url}/").status_code == 200  # they may look
    run_action(client, url, action, getattr(rows, row).pk)
    assert not done(rows)
    assert not Event.objects.filter(type=event).exists()


@pytest.mark.parametrize("url,action,row,event,done", ACTIONS, ids=[a[1] for a in ACTIONS])
def test_staff_with_the_permission_run_an_admin_action_through_the_service(team, rows, operator, url, action,
                                                                                    row, event, done):
    user, client = operator
    r = run_action(client, url, action, getattr(rows, row).pk, reason="operator cleanup")
    assert r.status_code == 302, r.content[:2000]
    assert done(rows)
    assert Event.objects.filter(type=event, actor=user).exists()


class FormFields(HTMLParser):
    """The values a browser would submit for the admin's change form."""

    def __init__(self):
        super().__init__()
        self.data, self._select, self._textarea = {}, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "input" and a.get("name") and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") in ("checkbox", "radio") and "checked" not in a:
                return
            self.data[a["name"]] = a.get("value", "on" if a.get("type") == "checkbox" else "")
        elif tag == "select" and a.get("name"):
            self._select = a["name"]
            self.data.setdefault(self._select, "")
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select] = a.get("value", "")
        elif tag == "textarea" and a.get("name"):
            self._textarea = a["name"]
            self.data[self._textarea] = ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data


def change_form(client, url):
    r = client.get(url)
    assert r.status_code == 200, r.status_code
    parser = FormFields()
    parser.feed(r.content.decode())
    return parser.data


def test_view_only_staff_cannot_change_a_row(team, rows, looker, operator):
    _, client = looker
    _, full = operator
    audited = set(Event.objects.filter(project=team.alpha, session__isnull=True).values_list("pk", flat=True))
    for url, change in ((f"/admin/accounts/project/{team.alpha.pk}/change/", {"name": "Renamed"}),
                        (f"/admin/collab/agentspec/{rows.spec.pk}/change/", {"system_prompt": "be evil"}),
                        (f"/admin/accounts/membership/{rows.membership.pk}/change/", {"role": "owner"})):
        data = {**change_form(full, url), **change}
        assert client.post(url, data).status_code == 403
    assert Project.objects.get(pk=team.alpha.pk).name == "Alpha"
    assert AgentSpec.objects.get(pk=rows.spec.pk).system_prompt == ""
    assert Membership.objects.get(pk=rows.membership.pk).role == "viewer"
    # nothing more audited than before (the fixture's spec, made through the API, is)
    assert set(Event.objects.filter(project=team.alpha, session__isnull=True).values_list("pk", flat=True)) == audited


def test_project_edits_in_the_admin_go_through_the_services(team, rows, operator, tmp_path):
    """Name, limits, workspace and a new member: each through its service, each audited."""
    user, client = operator
    url = f"/admin/accounts/project/{team.alpha.pk}/change/"
    data = change_form(client, url)
    prefix = next(k for k in data if k.endswith("-TOTAL_FORMS")).removesuffix("-TOTAL_FORMS")
    total = int(data[f"{prefix}-TOTAL_FORMS"])
    data.update({"name": "Alpha 2", "max_messages": "5", "workspace": str(tmp_path),
                 f"{prefix}-TOTAL_FORMS": str(total + 1), f"{prefix}-{total}-user": str(team.outsider.pk),
                 f"{prefix}-{total}-role": "viewer", f"{prefix}-{total}-project": str(team.alpha.pk)})
    r = client.post(url, data)
    assert r.status_code == 302, r.content[:3000]
    project = Project.objects.get(pk=team.alpha.pk)
    assert (project.name, project.max_messages, project.workspace) == ("Alpha 2", 5, str(tmp_path))
    types = set(Event.objects.filter(project=team.alpha, actor=user).values_list("type", flat=True))
    assert {"project.updated", "limits.changed", "workspace.changed", "member.invited"} <= types


def test_a_refused_admin_edit_changes_nothing(team, rows, operator, settings):
    """The services' rules hold in the admin: the last owner stays, limits stay under the ceiling,
    ``/`` is no workspace; the refusal is shown, nothing is written."""
    settings.TRELLIS_LIMIT_CEILINGS = {**settings.TRELLIS_LIMIT_CEILINGS, "max_messages": 4}
    user, client = operator
    owner = Membership.objects.get(project=team.alpha, user=team.owner)
    url = f"/admin/accounts/membership/{owner.pk}/change/"
    r = client.post(url, {**change_form(client, url), "role": "member"}, follow=True)
    assert "refused:" in r.content.decode().lower() and Membership.objects.get(pk=owner.pk).role == "owner"

    url = f"/admin/accounts/project/{team.alpha.pk}/change/"
    for change in ({"max_messages": "6"}, {"workspace": "/"}):
        r = client.post(url, {**change_form(client, url), **change}, follow=True)
        body = r.content.decode().lower()
        assert "refused:" in body or 'class="errornote"' in body  # the service's refusal or the form's
    project = Project.objects.get(pk=team.alpha.pk)
    assert (project.max_messages, project.workspace) == (8, "")
    assert not Event.objects.filter(project=team.alpha, actor=user).exists()


def test_a_spec_edit_in_the_admin_is_validated_and_audited(team, rows, operator):
    user, client = operator
    url = f"/admin/collab/agentspec/{rows.spec.pk}/change/"
    r = client.post(url, {**change_form(client, url), "system_prompt": "be brief"})
    assert r.status_code == 302, r.content[:3000]
    assert AgentSpec.objects.get(pk=rows.spec.pk).system_prompt == "be brief"
    event = Event.objects.get(type="agent_spec.changed", actor=user)
    assert event.payload == {"agent_id": "bot", "fields": ["system_prompt"]}
    r = client.post(url, {**change_form(client, url), "script": '[{"bogus": 1}]'}, follow=True)
    assert "refused:" in r.content.decode().lower()
    assert AgentSpec.objects.get(pk=rows.spec.pk).script == [{"text": "x"}]


def test_manage_py_limits_changes_limits_through_the_audited_service(team):
    """``manage.py limits`` writes ``limits.changed`` (from → to, no actor: the
    operator at the console) like the page, the API and the admin; a refused value writes nothing;
    showing the limits writes nothing."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    call_command("limits", "alpha", "max_messages=3", stdout=io.StringIO())
    event = Event.objects.get(type="limits.changed", project=team.alpha)
    assert event.actor is None and event.payload["changes"]["max_messages"]["to"] == 3, event.payload
    with pytest.raises(CommandError):
        call_command("limits", "alpha", "max_messages=-2", stdout=io.StringIO())
    call_command("limits", "alpha", stdout=io.StringIO())
    assert Event.objects.filter(type="limits.changed").count() == 1

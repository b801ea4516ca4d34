"""What the ``/lg`` tests share: a client that speaks to ``/lg`` as langgraph-sdk does, its
answers' checks, and the scripted agents they run."""

import json

from django.test import Client

from accounts.models import ApiToken, TokenScope

ANSWER = [  # a tool call, then the answer
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "write the plan"}}]},
    {"text": "planned: {{prompt}}"},
]
SLOW = [{"sleep_ms": 60000}, {"text": "slow: {{prompt}}"}]
APPROVAL = [  # its todo_create waits for a person where the spec's approvals name it
    {"tool_calls": [{"name": "todo_create", "arguments": {"subject": "ship it"}}]},
    {"text": "after the call: {{last.text}}"},
]
QUESTION = [
    {"tool_calls": [{"name": "ask_person", "arguments": {"question": "Which colour?", "choices": ["red", "blue"]}}]},
    {"text": "the person said {{last.text}}"},
]


def human(text: str) -> dict:
    """A run's ``input``: one person's message, as LangGraph clients send it."""
    return {"messages": [{"role": "user", "content": text}]}


class Lg:
    """A client of ``/lg`` as langgraph-sdk is one: JSON, the token in ``x-api-key`` (or, with
    ``header="HTTP_AUTHORIZATION"``, as a Bearer token)."""

    def __init__(self, raw_token=None, header="HTTP_X_API_KEY"):
        self.client = Client()
        self.headers = {header: raw_token if header == "HTTP_X_API_KEY" else f"Bearer {raw_token}"} if raw_token else {}

    def get(self, path, headers=None, **params):
        return self.client.get(f"/lg{path}", params, **self.headers, **(headers or {}))

    def post(self, path, data=None, **params):
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return self.client.post(f"/lg{path}" + (f"?{query}" if query else ""), json.dumps({} if data is None else data),
                                content_type="application/json", **self.headers)

    def patch(self, path, data=None):
        return self.client.patch(f"/lg{path}", json.dumps(data or {}), content_type="application/json", **self.headers)

    def delete(self, path):
        return self.client.delete(f"/lg{path}", **self.headers)


def lg_as(user, scopes=None, header="HTTP_X_API_KEY") -> Lg:
    _, raw = ApiToken.issue(user, name="lg", scopes=scopes or TokenScope.values)
    return Lg(raw, header)


def ok(response, status=200):
    assert response.status_code == status, (response.status_code, response.content)
    return response.json() if response.content else None


def refused(response, status, code):
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body

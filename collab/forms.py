"""The pages' forms (Django forms): they read what a page sends into what a service takes and
show it back with the refusal beside the field it names. The rules stay in the services — one
set for the pages, the API and the admin — so a form parses and never second-guesses them."""

import json

from django import forms

from collab.errors import DomainError
from collab.text import loads_bounded
from collab.models import AgentRole, FollowupMode, Toolset


MAX_JSON_CHARS = 1_000_000  # a script or limits field (the request body is bounded before this)


class JSONText(forms.CharField):
    """A textarea holding JSON of the given kinds (empty: an empty one of the first kind), read
    as every outside JSON is (``loads_bounded``: not too deep, no ``NaN`` or ``Infinity``)."""

    widget = forms.Textarea

    def __init__(self, name: str, *, kinds: tuple, **kwargs):
        super().__init__(required=False, strip=True, **kwargs)
        self.name, self.kinds = name, kinds

    def to_python(self, value):
        raw = super().to_python(value)
        if not raw:
            return self.kinds[0]()
        try:
            parsed = loads_bounded(raw, max_chars=MAX_JSON_CHARS)
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"{self.name} is not valid JSON: {exc}", code=f"invalid_{self.name}") from None
        if not isinstance(parsed, self.kinds):
            names = " or ".join(k.__name__.replace("dict", "object").replace("list", "array") for k in self.kinds)
            raise forms.ValidationError(f"{self.name} must be a JSON {names}", code=f"invalid_{self.name}")
        return parsed

    def prepare_value(self, value):
        if isinstance(value, (list, dict)):
            return json.dumps(value, indent=2, ensure_ascii=False) if value else ""
        return value


class AgentSpecForm(forms.Form):
    """An agent spec on its page (``collab.services.specs`` decides what is valid: the id's form,
    the connection and model, the toolset, role and tools, the script's shape, the limits)."""

    agent_id = forms.CharField(required=False)
    connection = forms.CharField(required=False)
    model = forms.CharField(required=False)
    system_prompt = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    toolset = forms.CharField(required=False, empty_value=Toolset.COLLAB)
    role = forms.CharField(required=False, empty_value=AgentRole.GENERAL)
    followup_mode = forms.CharField(required=False, empty_value=FollowupMode.TURN)
    tools = forms.CharField(required=False)
    script = JSONText("script", kinds=(list, dict))
    limits = JSONText("limits", kinds=(dict,))

    @classmethod
    def of(cls, spec) -> "AgentSpecForm":
        """The form showing a saved spec (or a new one's defaults)."""
        if spec is None:
            return cls(initial={"toolset": Toolset.COLLAB, "role": AgentRole.GENERAL,
                                "followup_mode": FollowupMode.TURN})
        return cls(initial={
            "agent_id": spec.agent_id, "connection": spec.connection.name if spec.connection_id else "",
            "model": spec.model, "system_prompt": spec.system_prompt, "toolset": spec.toolset, "role": spec.role,
            "followup_mode": spec.followup_mode, "tools": " ".join(spec.tools or []),
            "script": spec.script or [], "limits": spec.limits or {}})

    def clean_tools(self) -> list[str]:
        return [t for t in self.cleaned_data["tools"].replace(",", " ").split() if t]

    def spec_fields(self) -> dict:
        """What the spec service takes (the provider follows the connection); not the id."""
        return {name: value for name, value in self.cleaned_data.items() if name != "agent_id"}

    FIELD_OF_CODE = {"agent_id_taken": "agent_id", "provider_config": "connection"}

    def refuse(self, exc: DomainError) -> None:
        """The service's refusal, beside the field it is about (named by the refusal, or by its
        code: ``invalid_script`` → script), else above the form."""
        field = exc.extra.get("field") or self.FIELD_OF_CODE.get(exc.code) or exc.code.removeprefix("invalid_")
        self.add_error(field if field in self.fields else None, exc.detail)

    def values(self) -> dict:
        """Each field's value as the template writes it back."""
        return {name: self[name].value() if name not in ("script", "limits")
                else self.fields[name].prepare_value(self[name].value()) for name in self.fields}

    def message(self) -> str:
        """Every refusal in one line (the page's alert)."""
        return "; ".join(str(e) for errors in self.errors.values() for e in errors)


class DecisionForm(forms.Form):
    """A decision on an inbox item (the inbox page, docs/web-app.md#inbox), read for
    ``collab.inbox_api.decide_inbox_item``, which holds the rules. ``arguments`` comes only from
    the edit-and-approve form: the call's arguments, edited, as a JSON object."""

    decision = forms.CharField(required=False)
    arguments = JSONText("arguments", kinds=(dict,))
    reason = forms.CharField(required=False)
    answer = forms.CharField(required=False)

    def decision_fields(self) -> dict:
        """What ``decide_inbox_item`` takes; call after ``is_valid()``."""
        data = self.cleaned_data
        return {"decision": data["decision"], "arguments": data["arguments"] if "arguments" in self.data else None,
                "reason": data["reason"], "answer": data["answer"]}

    def message(self) -> str:
        return "; ".join(str(e) for errors in self.errors.values() for e in errors)

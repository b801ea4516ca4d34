"""Project limits (docs/contract.md#limits-and-defaults): one validator for the API, the settings
page and ``manage.py limits``.

Topology counts: integers >= 0, 0 = unlimited. Resource limits: null = inherit
(the deployment's ceiling, or no limit where it has none), explicit values must be positive.

Fair share (docs/capacity.md#fair-share): the operator's ceilings (``settings.TRELLIS_LIMIT_CEILINGS``,
the ``TRELLIS_MAX_*`` variables) bound every project. A value above its ceiling — or
0 ("unlimited") under a finite one — is refused, and ``effective_limit`` is what every
check uses: min(project, ceiling), so rows set before a ceiling was lowered are capped too.
"""

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import transaction

from accounts.models import Project

TOPOLOGY = ("max_spawn_depth", "max_messages", "max_spawn_fanout")
RESOURCES = (
    "max_live_per_session", "max_queued_per_session", "max_jobs_per_session", "max_tokens_per_job",
    "max_runtime_seconds", "max_idle_seconds", "max_running_jobs",
)
DECIMALS = ("max_cost_per_job",)
OTHER_POSITIVE = ("max_active_turns", "artifact_retention_days")
FIELDS = TOPOLOGY + RESOURCES + DECIMALS + OTHER_POSITIVE
MAX_INT = 2**31 - 1  # the columns' integer range
MAX_COST, COST_STEP = Decimal("1000000"), Decimal("0.000001")  # max_cost_per_job: (0, 1000000), 6 places
# an amount as decimal text that is at least one step and below MAX_COST (a subset of what
# Decimal() reads: no exponent, sign, spaces or more than 6 places)
COST_TEXT = r"^(?:[1-9][0-9]{0,5}(?:\.[0-9]{1,6})?|0?\.[0-9]{0,5}[1-9])$"


# the variable that sets each ceiling, named in refusals
CEILING_VARIABLES = {name: f"TRELLIS_{name.upper()}" for name in TOPOLOGY + RESOURCES + DECIMALS + ("max_active_turns",)}
CEILING_VARIABLES["max_running_jobs"] = "TRELLIS_MAX_RUNNING_PER_PROJECT"


class LimitError(ValueError):
    def __init__(self, field: str, reason: str, **extra):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.extra = extra


def ceiling(field: str):
    """The operator's ceiling on ``field``, or None where there is none."""
    return settings.TRELLIS_LIMIT_CEILINGS.get(field)


def effective_limit(project: Project, field: str):
    """The limit in force: the project's value bounded by the ceiling. Topology: 0 = unlimited;
    resources: None = no limit."""
    return limit_in_force(field, getattr(project, field))


def limit_in_force(field: str, value):
    """``effective_limit`` of a project whose ``field`` holds ``value`` (read apart from the
    project's row, e.g. by a statement that reads it as it is now)."""
    cap = ceiling(field)
    if cap is None:
        return value
    if value is None or (field in TOPOLOGY and value == 0):
        return cap
    return min(value, cap)


def limits_report(project: Project) -> dict:
    """The project's own values, plus the ceilings and the values in force (the API's answer)."""
    def wire(value):
        return str(value) if isinstance(value, Decimal) else value

    return {
        **limits_of(project),
        "ceilings": {name: wire(ceiling(name)) for name in CEILING_VARIABLES},
        "effective": {name: wire(effective_limit(project, name)) for name in CEILING_VARIABLES},
    }


def _check_ceiling(field: str, value) -> None:
    cap = ceiling(field)
    if cap is None:
        return
    variable = CEILING_VARIABLES[field]
    if field in TOPOLOGY and value == 0:
        raise LimitError(field, f"0 (unlimited) is above this deployment's ceiling of {cap} ({variable})",
                         ceiling=str(cap) if isinstance(cap, Decimal) else cap)
    if value is not None and value > cap:
        raise LimitError(field, f"must be at most {cap}, this deployment's ceiling ({variable})",
                         ceiling=str(cap) if isinstance(cap, Decimal) else cap)


def limits_of(project: Project) -> dict:
    out = {name: getattr(project, name) for name in FIELDS}
    out["max_cost_per_job"] = str(out["max_cost_per_job"]) if out["max_cost_per_job"] is not None else None
    return out


def _int(field, value, *, allow_zero: bool, allow_null: bool):
    if value is None or value == "":
        if allow_null:
            return None
        raise LimitError(field, "a value is required")
    if isinstance(value, bool):
        raise LimitError(field, "must be an integer")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise LimitError(field, f"must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != number:
        raise LimitError(field, "must be an integer")
    if number < 0 or (number == 0 and not allow_zero):
        raise LimitError(field, "must be >= 0 (0 = unlimited)" if allow_zero else "must be positive (or null to inherit)")
    if number > MAX_INT:
        raise LimitError(field, "is too large")
    return number


def limit_schema(field: str) -> dict:
    """What ``check_limits`` accepts for ``field`` on this deployment, as JSON Schema (the API
    publishes it with ``PATCH /api/projects/{slug}/limits``): the same bounds, the operator's
    ceiling included. Integers are stated as JSON integers, the amount also as decimal text
    (how the API answers it; not under a ceiling, which a pattern cannot bound)."""
    cap = ceiling(field) if field in CEILING_VARIABLES else None
    if field in DECIMALS:
        top = min(cap, MAX_COST - COST_STEP) if cap is not None else MAX_COST - COST_STEP
        choices = [{"type": "number", "minimum": float(COST_STEP), "maximum": float(top)}]
        if cap is None:
            choices.append({"type": "string", "pattern": COST_TEXT})
        return {"anyOf": [*choices, {"type": "null"}, {"type": "string", "maxLength": 0}]}
    lowest = 0 if field in TOPOLOGY and cap is None else 1  # 0 = unlimited: not under a ceiling
    number = {"type": "integer", "minimum": lowest, "maximum": min(cap, MAX_INT) if cap is not None else MAX_INT}
    if field in RESOURCES:
        return {"anyOf": [number, {"type": "null"}, {"type": "string", "maxLength": 0}]}
    return number


def check_limits(changes: dict) -> dict:
    """Validate a partial update; returns the cleaned values or raises ``LimitError``."""
    clean = {}
    for field, value in changes.items():
        if field in TOPOLOGY:
            clean[field] = _int(field, value, allow_zero=True, allow_null=False)
        elif field in RESOURCES:
            clean[field] = _int(field, value, allow_zero=False, allow_null=True)
        elif field in OTHER_POSITIVE:
            clean[field] = _int(field, value, allow_zero=False, allow_null=False)
        elif field in DECIMALS:
            if value is None or value == "":
                clean[field] = None
                continue
            try:
                amount = Decimal(str(value))
            except InvalidOperation:
                raise LimitError(field, f"must be a number, got {value!r}") from None
            if amount.is_finite() and 0 < amount < MAX_COST:
                amount = amount.quantize(COST_STEP)  # what is stored: 6 places, and positive (a CHECK)
            if not amount.is_finite() or amount <= 0 or amount >= MAX_COST:
                raise LimitError(field, "must be a positive amount below 1000000 (or null to inherit)")
            clean[field] = amount
        else:
            raise LimitError(field, f"unknown limit; known: {', '.join(FIELDS)}")
        if field in CEILING_VARIABLES:
            _check_ceiling(field, clean[field])
    return clean


def set_limits(project: Project, changes: dict) -> Project:
    clean = check_limits(changes)
    with transaction.atomic():
        for field, value in clean.items():
            setattr(project, field, value)
        project.save(update_fields=list(clean) or None)
    return project

"""Project limits (SPEC §7): one validator for the API, the settings page and ``manage.py limits``.

Topology counts: integers >= 0, 0 = unlimited. Resource limits: null = inherit
(no limit), explicit values must be positive.
"""

from decimal import Decimal, InvalidOperation

from django.db import transaction

from accounts.models import Project

TOPOLOGY = ("max_spawn_depth", "max_messages", "max_spawn_fanout")
RESOURCES = (
    "max_live_per_session", "max_queued_per_session", "max_jobs_per_session", "max_tokens_per_job",
    "max_runtime_seconds", "max_idle_seconds",
)
DECIMALS = ("max_cost_per_job",)
OTHER_POSITIVE = ("max_active_turns", "artifact_retention_days")
FIELDS = TOPOLOGY + RESOURCES + DECIMALS + OTHER_POSITIVE


class LimitError(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


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
    if number > 2**31 - 1:
        raise LimitError(field, "is too large")
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
            if not amount.is_finite() or amount <= 0 or amount >= Decimal("1000000"):
                raise LimitError(field, "must be a positive amount below 1000000 (or null to inherit)")
            clean[field] = amount.quantize(Decimal("0.000001"))
        else:
            raise LimitError(field, f"unknown limit; known: {', '.join(FIELDS)}")
    return clean


def set_limits(project: Project, changes: dict) -> Project:
    clean = check_limits(changes)
    with transaction.atomic():
        for field, value in clean.items():
            setattr(project, field, value)
        project.save(update_fields=list(clean) or None)
    return project

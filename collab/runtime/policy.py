"""What a turn may spend (the turn policy in docs/contract.md#the-openwork-toolset): the turn's own
policy (model calls, the doom-loop rule, tool calls) and the project's quotas (tokens, cost,
runtime, idle time). Each check raises (``enforce_*``) ``LimitExceeded`` with the error code the
job ends with (``collab.runtime.failures``)."""

from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings

from accounts.limits import effective_limit

from collab.models import AgentRole, Toolset
from collab.runtime.failures import LimitExceeded, ToolCallLimit

EXPLORER_MAX_MODEL_CALLS = 15
OPENWORK_MAX_MODEL_CALLS = 20
DOOM_LOOP_THRESHOLD = 3


@dataclass(frozen=True)
class TurnPolicy:
    """The turn's own bounds: ``max_model_calls`` and the doom-loop ``threshold`` (None: unbounded)."""

    max_model_calls: int | None = None
    doom_loop_threshold: int | None = None

    def enforce_model_calls(self, made: int) -> None:
        if self.max_model_calls and made >= self.max_model_calls:
            raise LimitExceeded("max_model_calls",
                                f"the turn used its {self.max_model_calls} model calls without a final answer")

    @staticmethod
    def enforce_tool_calls(made: int, asked: int) -> None:
        limit = settings.TRELLIS_MAX_TOOL_CALLS
        if made + asked > limit:
            raise ToolCallLimit(f"the turn reached its limit of {limit} tool calls")


def policy_for(role: str, toolset: str, spec) -> TurnPolicy:
    """An explorer has 15 model calls and the doom-loop rule; an OpenWork root 20
    (``limits.max_model_calls`` overrides) and the rule; a collab turn neither."""
    if role == AgentRole.EXPLORER:
        return TurnPolicy(EXPLORER_MAX_MODEL_CALLS, DOOM_LOOP_THRESHOLD)
    if toolset == Toolset.OPENWORK:
        limits = getattr(spec, "limits", None) or {}
        value = limits.get("max_model_calls") if isinstance(limits, dict) else None
        return TurnPolicy(value if isinstance(value, int) and value > 0 else OPENWORK_MAX_MODEL_CALLS, DOOM_LOOP_THRESHOLD)
    return TurnPolicy()


@dataclass
class DoomLoop:
    """Three timeouts of wait_agent in a row, or the same tool call (not wait_agent) three
    times in a row, end the turn as ``doom_loop``. No threshold: never."""

    threshold: int | None
    wait_timeouts: int = 0
    recent: list = field(default_factory=list)

    def count_wait(self, delivered: bool) -> None:
        """wait_agent's timeout streak: a delivery resets it."""
        self.wait_timeouts = 0 if delivered else self.wait_timeouts + 1

    def enforce(self, calls) -> None:
        threshold = self.threshold
        if not threshold:
            return
        if self.wait_timeouts >= threshold:
            raise LimitExceeded("doom_loop", f"wait_agent timed out {self.wait_timeouts} times in a row")
        for call in calls:
            if call.name == "wait_agent":
                continue
            self.recent = (self.recent + [(call.name, repr(call.arguments))])[-threshold:]
            if len(self.recent) == threshold and len(set(self.recent)) == 1:
                raise LimitExceeded("doom_loop", f"the same {call.name} call was repeated {threshold} times in a row")


def enforce_clock(project, *, running_for: float, idle_for: float) -> None:
    """The project's ceilings on a turn's wall time (``max_runtime_seconds``) and time without
    progress (``max_idle_seconds``), so no script (a sleep_ms step) outlasts them."""
    runtime = effective_limit(project, "max_runtime_seconds")
    idle = effective_limit(project, "max_idle_seconds")
    if runtime and running_for > runtime:
        raise LimitExceeded("quota.runtime_exceeded", f"the turn ran longer than {runtime} s (max_runtime_seconds)")
    if idle and idle_for > idle:
        raise LimitExceeded("quota.idle_exceeded", f"the turn made no progress for {idle} s (max_idle_seconds)")


def enforce_spend(project, *, tokens: int, cost: Decimal) -> None:
    """The project's ceilings on one job's tokens (``max_tokens_per_job``) and cost (``max_cost_per_job``)."""
    limit_tokens = effective_limit(project, "max_tokens_per_job")
    if limit_tokens and tokens > limit_tokens:
        raise LimitExceeded("quota.tokens_exhausted", f"the turn used more than {limit_tokens} tokens (max_tokens_per_job)")
    limit_cost = effective_limit(project, "max_cost_per_job")
    if limit_cost and cost > limit_cost:
        raise LimitExceeded("quota.cost_exhausted", f"the turn cost more than ${limit_cost} (max_cost_per_job)")

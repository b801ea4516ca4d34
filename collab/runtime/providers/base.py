from dataclasses import dataclass, field
from decimal import Decimal


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict


@dataclass
class ModelResponse:
    """One model call's answer: final ``text``, or ``tool_calls`` to run before the next call."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)  # $ for this call, from settings.TRELLIS_MODEL_PRICES


class ProviderError(Exception):
    """The model could not answer; the job fails with this code and readable reason."""

    def __init__(self, reason: str, code: str = "provider_error"):
        super().__init__(reason)
        self.reason = reason
        self.code = code

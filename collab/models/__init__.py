from collab.models.artifacts import Artifact
from collab.models.asks import DECIDED_STATUSES, AskKind, AskRule, AskStatus, PersonAsk
from collab.models.branches import Branch, NameStage, effective_spec, effective_spec_id, format_address
from collab.models.connections import ConnectionProvider, ConnectionSource, ModelConnection
from collab.models.events import Event
from collab.models.holds import HeldDelivery, HoldStatus
from collab.models.inbox import InboxEntry, InboxKind
from collab.models.jobs import (
    ACTIVE_STATUSES,
    CANCEL,
    MAX_PROMPT_CHARS,
    OPEN_STATUSES,
    STRATEGIES,
    TERMINAL_STATUSES,
    ExecutionCommand,
    FollowupState,
    Job,
    JobKind,
    JobStatus,
    is_busy,
    is_occupied,
)
from collab.models.sessions import Message, MessageKind, MessageRole, Session, SessionShare, Visibility
from collab.models.specs import AgentRole, AgentSpec, FollowupMode, Provider, Toolset
from collab.models.todos import Todo, TodoStatus
from collab.models.webhooks import DeliveryEvent, DeliveryStatus, Webhook, WebhookDelivery

__all__ = [
    "DECIDED_STATUSES",
    "AskKind",
    "AskRule",
    "AskStatus",
    "PersonAsk",
    "ACTIVE_STATUSES",
    "CANCEL",
    "MAX_PROMPT_CHARS",
    "OPEN_STATUSES",
    "STRATEGIES",
    "TERMINAL_STATUSES",
    "AgentRole",
    "AgentSpec",
    "Artifact",
    "Branch",
    "ConnectionProvider",
    "ConnectionSource",
    "DeliveryEvent",
    "DeliveryStatus",
    "Event",
    "ExecutionCommand",
    "FollowupMode",
    "FollowupState",
    "HeldDelivery",
    "HoldStatus",
    "InboxEntry",
    "InboxKind",
    "Job",
    "JobKind",
    "JobStatus",
    "Message",
    "MessageKind",
    "MessageRole",
    "ModelConnection",
    "NameStage",
    "Provider",
    "Session",
    "SessionShare",
    "Todo",
    "TodoStatus",
    "Toolset",
    "Visibility",
    "effective_spec",
    "effective_spec_id",
    "format_address",
    "is_busy",
    "is_occupied",
    "Webhook",
    "WebhookDelivery",
]

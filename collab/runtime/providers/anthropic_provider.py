"""The ``anthropic`` provider: the Messages API through the official SDK.

Tools are offered with their JSON Schema as ``input_schema``; ``tool_use`` blocks
become tool calls and results go back as ``tool_result`` blocks in the next user
message (before any user text, as the API requires). Streaming (the default)
assembles text and ``input_json_delta`` fragments per content block, takes usage
from ``message_start`` / ``message_delta`` and checks for a stop request between
events, so a cancel closes the stream promptly.
"""

import anthropic
from django.conf import settings

from collab.runtime.providers.base import ModelResponse, ToolCall
from collab.runtime.providers.mapping import (
    TITLE_SYSTEM,
    anthropic_messages,
    anthropic_tools,
    parse_arguments,
    title_request,
)
from collab.runtime.providers.remote import RemoteProvider

TITLE_MAX_TOKENS = 30


class AnthropicProvider(RemoteProvider):
    name = "anthropic"
    sdk = anthropic
    official_base_url = "https://api.anthropic.com"

    def _client(self, key: str, http_client):
        # retries are ours (counted, backed off, recorded as events), so the SDK makes none
        return anthropic.Anthropic(api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0,
                             http_client=http_client)

    def request(self, turn) -> dict:
        """The Messages API request for this model call (without ``stream``)."""
        kwargs = {
            "model": self.model,
            "max_tokens": self.max_tokens or settings.TRELLIS_MODEL_MAX_TOKENS,
            "messages": anthropic_messages(turn.history(), fallback_user_text=turn.prompt),
        }
        system = turn.system_prompt
        if system:
            kwargs["system"] = system
        tools = anthropic_tools(turn.available_tools())
        if tools:
            kwargs["tools"] = tools
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        return kwargs

    def _complete(self, client, turn) -> ModelResponse:
        kwargs = self.request(turn)
        if not self.stream:
            return self._answer(client.messages.create(**kwargs))
        stream = client.messages.create(**kwargs, stream=True)
        try:
            return self._assemble(stream, turn)
        finally:
            stream.close()

    def _answer(self, message) -> ModelResponse:
        text, calls = [], []
        for block in message.content or []:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolCall(id=block.id, name=block.name, arguments=parse_arguments(block.input)))
        tokens_in, tokens_out = _input_tokens(message.usage), (message.usage.output_tokens or 0) if message.usage else 0
        return ModelResponse(
            text="".join(text), tool_calls=calls, tokens_in=tokens_in, tokens_out=tokens_out,
            cost=self.cost(tokens_in, tokens_out),
        )

    def _assemble(self, stream, turn) -> ModelResponse:
        blocks: dict[int, dict] = {}
        order: list[int] = []
        tokens_in = tokens_out = 0
        on_delta = getattr(turn, "on_text_delta", None)
        for event in stream:
            turn.check_stop()
            turn.progressed()
            kind = event.type
            if kind == "message_start":
                tokens_in = _input_tokens(event.message.usage)
                tokens_out = (event.message.usage.output_tokens or 0) if event.message.usage else 0
            elif kind == "content_block_start":
                block = event.content_block
                entry = {"type": block.type, "text": "", "id": "", "name": "", "json": "", "input": None}
                if block.type == "text":
                    entry["text"] = block.text or ""
                elif block.type == "tool_use":
                    entry.update(id=block.id, name=block.name, input=block.input)
                blocks[event.index] = entry
                order.append(event.index)
            elif kind == "content_block_delta":
                entry = blocks.get(event.index)
                delta = event.delta
                if entry is None:
                    continue
                if delta.type == "text_delta":
                    entry["text"] += delta.text
                    if on_delta:
                        on_delta(delta.text)
                elif delta.type == "input_json_delta":
                    entry["json"] += delta.partial_json
            elif kind == "message_delta" and event.usage is not None:
                tokens_out = event.usage.output_tokens or tokens_out
                if event.usage.input_tokens:
                    tokens_in = _input_tokens(event.usage)
        text, calls = [], []
        for index in order:
            entry = blocks[index]
            if entry["type"] == "text":
                text.append(entry["text"])
            elif entry["type"] == "tool_use":
                raw = entry["json"] if entry["json"] else (entry["input"] or {})
                calls.append(ToolCall(id=entry["id"], name=entry["name"], arguments=parse_arguments(raw)))
        return ModelResponse(
            text="".join(text), tool_calls=calls, tokens_in=tokens_in, tokens_out=tokens_out,
            cost=self.cost(tokens_in, tokens_out),
        )

    def _title(self, client, messages) -> str:
        message = client.messages.create(
            model=self.model,
            max_tokens=TITLE_MAX_TOKENS,
            system=TITLE_SYSTEM,
            messages=[{"role": "user", "content": title_request(messages)}],
        )
        return "".join(b.text for b in message.content or [] if b.type == "text")


def _input_tokens(usage) -> int:
    """All input tokens: uncached plus cache writes and reads."""
    if usage is None:
        return 0
    return (usage.input_tokens or 0) + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0)

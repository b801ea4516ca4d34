"""The ``openai`` provider: Chat Completions through the official SDK, against OpenAI or any
OpenAI-compatible endpoint (a model connection's ``base_url``: vLLM, Ollama, llama.cpp server …).

Function tools come from the turn's available tools (their JSON Schema is the one
source); several tool calls in one answer run in order; results go back as
``role: "tool"`` messages. Streaming (the default) assembles text and tool-call
argument fragments from the deltas, takes usage from the final chunk
(``stream_options.include_usage``) and checks for a stop request between chunks,
so a cancel closes the stream promptly.
"""

import openai

from collab.runtime.providers.base import ModelResponse, ProviderError, ToolCall
from collab.runtime.providers.mapping import TITLE_SYSTEM, openai_messages, openai_tools, parse_arguments, title_request
from collab.runtime.providers.remote import RemoteProvider

TITLE_MAX_TOKENS = 30


class OpenAIProvider(RemoteProvider):
    name = "openai"
    sdk = openai
    official_base_url = "https://api.openai.com/v1"

    def _client(self, key: str, http_client):
        # retries are ours (counted, backed off, recorded as events), so the SDK makes none
        return openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout, max_retries=0,
                             http_client=http_client)

    def request(self, turn) -> dict:
        """The Chat Completions request for this model call (without ``stream``)."""
        kwargs = {
            "model": self.model,
            "messages": openai_messages(turn.history(), turn.system_prompt, fallback_user_text=turn.prompt),
        }
        tools = openai_tools(turn.available_tools())
        if tools:
            kwargs["tools"] = tools
            kwargs["parallel_tool_calls"] = True
            choice = self.tool_choice(turn, tools)
            if choice is not None:
                kwargs["tool_choice"] = choice
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        return kwargs

    def tool_choice(self, turn, tools: list[dict]):
        """``limits.tool_choice`` ("auto", "required" or a tool's name) for the first model call of
        a turn, later calls left to the model; after ``limits.tool_rounds`` model calls the model
        must answer in text ("none"). Small local models need both: forced, they call tools
        well (llama.cpp's chatml-function-calling format); unforced, they call them forever."""
        rounds = self.option("tool_rounds", None, int)
        if rounds is not None and turn.model_calls >= rounds:
            return "none"
        wanted = self.option("tool_choice", None)
        if wanted is None or turn.model_calls > 0:
            return None
        if wanted in ("auto", "required", "none"):
            return wanted
        if any(t["function"]["name"] == wanted for t in tools):
            return {"type": "function", "function": {"name": wanted}}
        raise ProviderError(f"limits.tool_choice names {wanted!r}, which this agent is not offered", code="provider_config")

    def _complete(self, client, turn) -> ModelResponse:
        kwargs = self.request(turn)
        if not self.stream:
            return self._answer(client.chat.completions.create(**kwargs))
        stream = client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
        with stream:
            return self._assemble(stream, turn)

    def _answer(self, completion) -> ModelResponse:
        choice = completion.choices[0] if completion.choices else None
        message = choice.message if choice else None
        calls = []
        for n, tc in enumerate((message.tool_calls if message else None) or []):
            function = getattr(tc, "function", None)
            calls.append(ToolCall(
                id=tc.id or f"call_{n}",
                name=getattr(function, "name", "") or "",
                arguments=parse_arguments(getattr(function, "arguments", "")),
            ))
        usage = completion.usage
        tokens_in = (usage.prompt_tokens or 0) if usage else 0
        tokens_out = (usage.completion_tokens or 0) if usage else 0
        return ModelResponse(
            text=(message.content or "") if message else "", tool_calls=calls,
            tokens_in=tokens_in, tokens_out=tokens_out, cost=self.cost(tokens_in, tokens_out),
        )

    def _assemble(self, stream, turn) -> ModelResponse:
        text: list[str] = []
        slots: list[dict] = []  # one per tool call, in the order the model opened them
        by_index: dict[int, dict] = {}
        tokens_in = tokens_out = 0
        on_delta = getattr(turn, "on_text_delta", None)
        for chunk in stream:
            turn.check_stop()
            turn.progressed()
            if chunk.usage:
                tokens_in = chunk.usage.prompt_tokens or 0
                tokens_out = chunk.usage.completion_tokens or 0
            for choice in chunk.choices or []:
                delta = choice.delta
                if delta is None:
                    continue
                if delta.content:
                    text.append(delta.content)
                    if on_delta:
                        on_delta(delta.content)
                for part in delta.tool_calls or []:
                    index = part.index if part.index is not None else len(slots)
                    slot = by_index.get(index)
                    if slot is None or (part.id and slot["id"] and part.id != slot["id"]):
                        slot = {"id": "", "name": "", "arguments": ""}
                        by_index[index] = slot
                        slots.append(slot)
                    if part.id:
                        slot["id"] = part.id
                    function = part.function
                    if function is not None:
                        if function.name and function.name != slot["name"]:
                            # the name comes whole in the first delta; some servers repeat or split it
                            slot["name"] += function.name
                        if function.arguments:
                            slot["arguments"] += function.arguments
        calls = [
            ToolCall(id=s["id"] or f"call_{n}", name=s["name"], arguments=parse_arguments(s["arguments"]))
            for n, s in enumerate(slots)
        ]
        return ModelResponse(
            text="".join(text), tool_calls=calls, tokens_in=tokens_in, tokens_out=tokens_out,
            cost=self.cost(tokens_in, tokens_out),
        )

    def _title(self, client, messages) -> str:
        completion = client.chat.completions.create(
            model=self.model,
            messages=[{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": title_request(messages)}],
            max_tokens=TITLE_MAX_TOKENS,
        )
        choice = completion.choices[0] if completion.choices else None
        return (choice.message.content or "") if choice and choice.message else ""

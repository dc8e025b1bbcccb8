"""Request validation with the provider's strictness, so client protocol bugs surface here.

Each check raises InvalidRequest with a message that names the offending field, like the
real API's `messages.3.content.0: ...` messages.
"""

from __future__ import annotations

from typing import Any

from .generate import signature


class InvalidRequest(Exception):
    """A 400 invalid_request_error."""


_BLOCK_TYPES = {"text", "image", "document", "tool_use", "tool_result", "thinking",
                "redacted_thinking", "search_result"}
_TOOL_CHOICES = {"auto", "any", "tool", "none"}


def validate(body: Any, *, need_max_tokens: bool = True) -> None:
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required" if model is None
                             else "model: Input should be a non-empty string")
    if need_max_tokens:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise InvalidRequest("max_tokens: Field required")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise InvalidRequest("max_tokens: Input should be a positive integer")
    _validate_system(body.get("system"))
    tool_names = _validate_tools(body.get("tools"))
    _validate_tool_choice(body.get("tool_choice"), tool_names)
    _validate_messages(body.get("messages"))
    _validate_thinking(body)


def _validate_thinking(body: dict[str, Any]) -> None:
    """Extended thinking: a budget of at least 1024 below max_tokens; with it on, the last
    assistant turn (a tool turn being answered) passes its thinking block back first, with
    its signature unchanged."""
    thinking = body.get("thinking")
    if thinking is None or (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        return
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        raise InvalidRequest("thinking: Input should be {\"type\": \"enabled\", "
                             "\"budget_tokens\": N} or {\"type\": \"disabled\"}")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024:
        raise InvalidRequest("thinking.enabled.budget_tokens: Input should be greater than or "
                             "equal to 1024")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and budget >= max_tokens:
        raise InvalidRequest("`max_tokens` must be greater than `thinking.budget_tokens`")
    messages = body.get("messages") or []
    last = messages[-1] if messages else None
    prior = messages[-2] if len(messages) >= 2 else None
    if not (isinstance(last, dict) and isinstance(prior, dict)
            and prior.get("role") == "assistant" and isinstance(prior.get("content"), list)):
        return
    blocks = prior["content"]
    if not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks):
        return
    first = blocks[0] if blocks else {}
    if first.get("type") not in ("thinking", "redacted_thinking"):
        raise InvalidRequest(
            f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or "
            f"`redacted_thinking`, but found `{first.get('type')}`. When `thinking` is "
            "enabled, a final `assistant` message must start with a thinking block.")
    if first.get("type") == "thinking" and first.get("signature") != signature(
            str(first.get("thinking", ""))):
        raise InvalidRequest(f"messages.{len(messages) - 2}.content.0: Invalid `signature` in "
                             "`thinking` block")


def _validate_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise InvalidRequest("system: Input should be a string or a list of text blocks")
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" \
                or not isinstance(block.get("text"), str):
            raise InvalidRequest(f"system.{i}: Input should be a text block "
                                 '{"type": "text", "text": "..."}')


def _validate_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise InvalidRequest("tools: Input should be a valid list")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"tools.{i}: Input should be an object")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools.{i}.name: Field required")
        if name in names:
            raise InvalidRequest(f"tools: Tool names must be unique (duplicate: {name!r})")
        names.add(name)
        if "type" not in tool or tool.get("type") == "custom":
            if not isinstance(tool.get("input_schema"), dict):
                raise InvalidRequest(f"tools.{i}.input_schema: Field required")
    return names


def _validate_tool_choice(choice: Any, tool_names: set[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in _TOOL_CHOICES:
        raise InvalidRequest("tool_choice: Input should be an object whose type is one of "
                             "'auto', 'any', 'tool', 'none'")
    if choice["type"] == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            raise InvalidRequest("tool_choice.name: Field required")
        if name not in tool_names:
            raise InvalidRequest(
                f"tool_choice.name: tool {name!r} is not among the request's tools")
    if choice["type"] in ("tool", "any") and not tool_names:
        raise InvalidRequest("tool_choice: a tool must be provided when tool_choice is "
                             f"{choice['type']!r}")


def _validate_messages(messages: Any) -> None:
    if messages is None:
        raise InvalidRequest("messages: Field required")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: at least one message is required")
    expected = "user"
    pending: list[str] = []  # tool_use ids the next user message must answer
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages.{i}: Input should be an object")
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if role != expected:
            if i == 0:
                raise InvalidRequest("messages: first message must use the \"user\" role")
            raise InvalidRequest(f"messages.{i}: roles must alternate between \"user\" and "
                                 f"\"assistant\", but found two consecutive {role!r} messages")
        blocks = _blocks(message.get("content"), i)
        if role == "user":
            answered = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            missing = [t for t in pending if t not in answered]
            if missing:
                raise InvalidRequest(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message.")
            unexpected = [t for t in answered if t not in pending]
            if unexpected:
                raise InvalidRequest(
                    f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {', '.join(map(str, unexpected))}. Each `tool_result` block must "
                    "have a corresponding `tool_use` block in the previous message.")
            pending = []
        else:
            pending = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        expected = "assistant" if role == "user" else "user"
    if pending:
        raise InvalidRequest(
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {', '.join(pending)}. Each `tool_use` block must have "
            "a corresponding `tool_result` block in the next message.")


def _blocks(content: Any, i: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return []
    if not isinstance(content, list):
        raise InvalidRequest(f"messages.{i}.content: Input should be a string or a list of "
                             "content blocks")
    for j, block in enumerate(content):
        where = f"messages.{i}.content.{j}"
        if not isinstance(block, dict) or block.get("type") not in _BLOCK_TYPES:
            raise InvalidRequest(f"{where}: Input should be a content block with a valid type")
        kind = block["type"]
        if kind == "text" and not isinstance(block.get("text"), str):
            raise InvalidRequest(f"{where}.text: Field required")
        if kind == "tool_use" and (not isinstance(block.get("id"), str)
                                   or not isinstance(block.get("name"), str)
                                   or not isinstance(block.get("input"), dict)):
            raise InvalidRequest(f"{where}: tool_use blocks need string `id`, `name` and an "
                                 "object `input`")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequest(f"{where}.tool_use_id: Field required")
    return content

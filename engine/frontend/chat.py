"""Conversations to token ids through the model's own chat template.

Roles as OpenAI's API has them: `developer` is the newer name of `system`, so templates
that do not know it get `system`; `tool` messages and assistant `tool_calls` go to templates
that render them, and to the others as plain text turns (the generic tool format's, see
generic_tools.py). A template that raises is a bad-input error with the template's own
message, never a crash.
"""

from kvdeck.engine.frontend.generic_tools import history_as_text

ROLES = ("system", "developer", "user", "assistant", "tool")


def check_unicode(text: str, what: str) -> None:
    """ValueError for text that is not valid Unicode (JSON can carry lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} is not valid Unicode: a lone surrogate at character "
                         f"{exc.start}") from None


# apply_chat_template's own arguments: chat_template_kwargs may not set them.
_TEMPLATE_CALL_ARGS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "messages"})


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None,
                template_kwargs: dict | None = None) -> list[int]:
    """Token ids of the conversation, ready for the assistant's reply. `template_kwargs`:
    more variables for the template (vLLM's chat_template_kwargs: `enable_thinking`)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError("this model's tokenizer has no chat template; use a plain completion")
    prepared = prepare_messages(messages, template)
    extra = check_template_kwargs(template_kwargs)
    try:
        ids = tokenizer.apply_chat_template(prepared, tools=tools, add_generation_prompt=True,
                                            tokenize=True, **extra)
    except Exception as exc:  # jinja2 errors and the templates' own raise_exception
        raise ValueError(f"the model's chat template cannot render these messages: "
                         f"{type(exc).__name__}: {exc}") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def check_template_kwargs(kwargs: object) -> dict:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise ValueError(f"chat_template_kwargs must be an object, got {kwargs!r}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"chat_template_kwargs: {name!r} is not a template variable name")
        if name in _TEMPLATE_CALL_ARGS:
            raise ValueError(f"chat_template_kwargs: {name!r} is set by the engine, not by a request")
    return kwargs


def prepare_messages(messages: list[dict], template: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    prepared = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"messages[{i}] must have 'role' and 'content'")
        role, content = message["role"], message.get("content")
        tool_calls = message.get("tool_calls")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role {role!r} is not a known role")
        if content is None and not (role == "assistant" and tool_calls):
            if "content" not in message:
                raise ValueError(f"messages[{i}] must have 'role' and 'content'")
            raise ValueError(f"messages[{i}].content must be a string (null only for an "
                             "assistant message with tool_calls)")
        if content is not None:
            if not isinstance(content, str):
                raise ValueError(f"messages[{i}].content must be a string")
            check_unicode(content, f"messages[{i}].content")
        if role == "developer" and "developer" not in template:
            role = "system"
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise ValueError(f"messages[{i}].tool_calls must be a list")
        prepared.append({**message, "role": role})
    if "tool" not in template:  # it cannot show tool turns: they become text it can show
        prepared = history_as_text(prepared)
    return prepared

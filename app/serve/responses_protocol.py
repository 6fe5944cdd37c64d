"""Request bodies of OpenAI's Responses API (/v1/responses), the subset kvdeck serves: text
input and history as messages, function tools and their calls and outputs, `text.format`
for JSON, and `previous_response_id` to continue a kept response (responses_store.py;
OpenAI's Conversations API, `conversation`, is refused with a message, the route's). Types
are strict, as in protocol.py; an item, content part or tool of a kind kvdeck does not serve
is a 400 that names it.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from kvdeck.app.serve.protocol import MAX_MESSAGES, OPENAI_MAX_TEMPERATURE, also_a_string, bounded

INPUT_ITEM_KINDS = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PART_KINDS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["input_text", "output_text", "text"]
    text: StrictStr


def _text_parts_only(content: Any) -> Any:
    """Said before the union's own errors, which would only say "a valid string"."""
    if isinstance(content, list):
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind not in TEXT_PART_KINDS:
                raise ValueError(f"content parts of type {kind!r} are not supported: kvdeck's "
                                 "models read text only (give parts of type 'input_text')")
    return content


def joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


class MessageItem(BaseModel):
    """A message of the conversation: {"role", "content"}, `type` "message" or left out."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[TextPart]

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        return _text_parts_only(content)


class FunctionCallItem(BaseModel):
    """A call the model made in an earlier turn (sent back with its output)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"]
    call_id: Annotated[StrictStr, Field(min_length=1)]
    name: StrictStr
    arguments: StrictStr


class FunctionCallOutputItem(BaseModel):
    """What the app's function returned for `call_id`."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output"]
    call_id: Annotated[StrictStr, Field(min_length=1)]
    output: StrictStr | list[TextPart]

    @field_validator("output", mode="before")
    @classmethod
    def _text_only(cls, output: Any) -> Any:
        return _text_parts_only(output)


class ReasoningItem(BaseModel):
    """The model's thinking in an earlier turn: taken and left out of the prompt, as chat
    templates leave earlier turns' thinking out."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["reasoning"]


InputItem = Annotated[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
                      Field(discriminator="type")]


class FunctionTool(BaseModel):
    """The Responses API's function tool: flat ({"type", "name", ...}), not chat's nested
    {"function": {...}}."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: StrictBool | None = None
    namespace: StrictStr | None = None  # the namespace tool it came in (its calls name it)


# OpenAI runs these tools itself; kvdeck cannot, so the model is not offered them (the
# response's `tools` lists what it was offered). Codex sends web_search with every turn.
HOSTED_TOOL_KINDS = frozenset({"file_search", "code_interpreter", "image_generation", "mcp",
                               "computer_use", "computer_use_preview"})


def is_hosted(kind: str) -> bool:
    return kind in HOSTED_TOOL_KINDS or kind.startswith("web_search")


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: StrictStr


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON matching `schema`."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr = "response"
    description: StrictStr | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


class ReasoningOptions(BaseModel):
    """Taken and not acted on: a model thinks as its chat template says
    (chat_template_kwargs {"enable_thinking": false} turns Qwen3's off)."""

    model_config = ConfigDict(extra="ignore")
    effort: StrictStr | None = None
    summary: StrictStr | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses. Sampling fields beyond OpenAI's (top_k, min_p, the penalties,
    seed, stop) are vLLM's extras, as on the chat route."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    # A string is one user message (the validator makes it one, so errors name the item).
    # One under chat's bound: `instructions` adds the system message.
    input: Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES - 1,
                                            json_schema_extra=also_a_string)]
    instructions: StrictStr | None = None
    max_output_tokens: bounded("int", "max_tokens") | None = None
    temperature: bounded("number", "temperature", OPENAI_MAX_TEMPERATURE) | None = None
    top_p: bounded("number", "top_p") | None = None
    top_k: bounded("int", "top_k") | None = None
    min_p: bounded("number", "min_p") | None = None
    presence_penalty: bounded("number", "presence_penalty") | None = None
    frequency_penalty: bounded("number", "frequency_penalty") | None = None
    repetition_penalty: bounded("number", "repetition_penalty") | None = None
    seed: bounded("int", "seed") | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=4)] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: StrictBool = True
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    # "message.output_text.logprobs" returns the answer's logprobs (top_logprobs of them)
    include: Annotated[list[StrictStr], Field(max_length=16)] | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    stream: StrictBool = False
    store: StrictBool = True  # OpenAI's default: kept for previous_response_id and fetching
    previous_response_id: StrictStr | None = None  # a kept response this one continues
    conversation: StrictStr | dict | None = None  # refused: no Conversations API
    background: StrictBool = False  # refused when true
    truncation: Literal["disabled", "auto"] = "disabled"  # "auto" refused
    metadata: Annotated[dict[StrictStr, StrictStr], Field(max_length=16)] | None = None
    user: StrictStr | None = None
    chat_template_kwargs: dict[StrictStr, Any] | None = None  # vLLM's, as on the chat route

    @field_validator("input", mode="before")
    @classmethod
    def _served_items(cls, items: Any) -> Any:
        """A string is the user's message; a message may leave out `type`; an item or a
        content part kvdeck does not serve is named."""
        if isinstance(items, str):
            if not items:
                raise ValueError("input must not be empty")
            return [{"type": "message", "role": "user", "content": items}]
        if not isinstance(items, list):
            return items
        typed = []
        for item in items:
            if isinstance(item, dict) and "type" not in item and "role" in item:
                item = {**item, "type": "message"}
            kind = item.get("type") if isinstance(item, dict) else None
            if isinstance(kind, str) and kind not in INPUT_ITEM_KINDS:
                raise ValueError(f"input items of type {kind!r} are not supported: kvdeck serves "
                                 "messages, function calls and their outputs (send the "
                                 "conversation itself, or continue a response with "
                                 "previous_response_id)")
            if kind == "message":
                _text_parts_only(item.get("content"))
            typed.append(item)
        return typed

    @field_validator("tools", mode="before")
    @classmethod
    def _served_tools(cls, tools: Any) -> Any:
        """Function tools as given; a namespace's functions (Codex groups some so) as
        function tools that remember it; hosted tools left out; any other kind named."""
        if not isinstance(tools, list):
            return tools
        served = []
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind == "namespace":
                inner = tool.get("tools")
                if not isinstance(inner, list):
                    raise ValueError("a namespace tool needs its list of tools")
                served += [{**t, "namespace": tool.get("name")} if isinstance(t, dict) else t
                           for t in inner]
            elif isinstance(kind, str) and is_hosted(kind):
                continue
            elif isinstance(kind, str) and kind != "function":
                raise ValueError(f"tools of type {kind!r} are not supported: kvdeck serves "
                                 "function tools (your app runs them)")
            else:
                served.append(tool)
        return served

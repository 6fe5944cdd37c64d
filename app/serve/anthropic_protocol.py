"""Request bodies of Anthropic's Messages API (/v1/messages), the subset kvdeck serves: text,
client tools (`tool_use` and `tool_result` blocks), thinking blocks in the history, and
`output_format` for JSON. Types are strict, as in protocol.py; a content block or a tool of
a kind kvdeck does not serve (images, documents, server tools such as web search) is a 400
that names it.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator

from kvdeck.app.serve.protocol import MAX_MESSAGES, also_a_string, bounded
from kvdeck.engine.types.sampling_params import MAX_STOP_STRINGS

BLOCK_KINDS = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
ANTHROPIC_MAX_TEMPERATURE = 1.0  # Anthropic's range is [0, 1]
SERVER_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_")


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ToolUseBlock(BaseModel):
    """A call the model made in an earlier turn."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: Annotated[StrictStr, Field(min_length=1)]
    name: StrictStr
    input: dict


class ToolResultBlock(BaseModel):
    """What the app's tool returned for `tool_use_id` (in a user message)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: Annotated[StrictStr, Field(min_length=1)]
    content: StrictStr | list[TextBlock] = ""
    is_error: StrictBool = False

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        return _served_blocks(content, ("text",))

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else \
            "\n".join(block.text for block in self.content)


class ThinkingBlock(BaseModel):
    """Earlier turns' thinking: taken and left out of the prompt, as chat templates leave
    earlier thinking out."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock,
                  Field(discriminator="type")]


def _served_blocks(content: Any, kinds: tuple[str, ...] = BLOCK_KINDS) -> Any:
    """A block kvdeck does not serve is named (before the union's own errors, which would
    only say "a valid string")."""
    if isinstance(content, list):
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind not in kinds:
                raise ValueError(f"content blocks of type {kind!r} are not supported: kvdeck's "
                                 "models read text, and tools run in your app")
    return content


class Message(BaseModel):
    """A turn; "system" is a system message in the middle of the conversation (Anthropic's
    mid-conversation system messages, which Claude Code sends; its text blocks only)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[Block], Field(min_length=1, json_schema_extra=also_a_string)]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, content: Any) -> Any:
        """A string is one text block."""
        if isinstance(content, str):
            if not content:
                raise ValueError("content must not be empty")
            return [{"type": "text", "text": content}]
        return _served_blocks(content)


class Tool(BaseModel):
    """A client tool: the app runs it (`type` "custom" or left out)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["custom"] | None = None
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    input_schema: dict


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool = False


class ThinkingConfig(BaseModel):
    """"disabled" turns a template's thinking off (enable_thinking false, as Qwen3's reads it);
    otherwise a model thinks as its template says, and budget_tokens is not enforced."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[StrictInt, Field(ge=0)] | None = None


class OutputFormat(BaseModel):
    """Anthropic's structured outputs: the reply as JSON matching `schema`."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["json_schema"]
    schema_: dict = Field(alias="schema")


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens: what a request's prompt would count."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES - 1)]
    system: StrictStr | list[TextBlock] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    @field_validator("system", mode="before")
    @classmethod
    def _text_system(cls, system: Any) -> Any:
        return _served_blocks(system, ("text",))

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, tools: Any) -> Any:
        """Client tools as given; server tools (web search, web fetch, code execution: Anthropic
        runs them, kvdeck cannot) left out, as on the Responses API; Anthropic's schema-less
        client tools (bash, text_editor, computer) named: kvdeck has not their schemas."""
        if not isinstance(tools, list):
            return tools
        served = []
        for tool in tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind.startswith(SERVER_TOOL_PREFIXES):
                continue
            if isinstance(kind, str) and kind != "custom":
                raise ValueError(f"tools of type {kind!r} are not supported: kvdeck serves "
                                 "client tools with an input_schema (your app runs them)")
            served.append(tool)
        return served


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages. top_k is Anthropic's; temperature is in Anthropic's [0, 1]."""

    max_tokens: bounded("int", "max_tokens")
    stop_sequences: Annotated[list[StrictStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    temperature: bounded("number", "temperature", ANTHROPIC_MAX_TEMPERATURE) | None = None
    top_p: bounded("number", "top_p") | None = None
    top_k: bounded("int", "top_k") | None = None
    stream: StrictBool = False
    output_format: OutputFormat | None = None
    metadata: dict | None = None  # taken (user_id), not acted on

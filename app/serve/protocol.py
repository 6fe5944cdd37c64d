"""Request bodies of the OpenAI API (the subset kvdeck serves), as pydantic models.

Types are strict where OpenAI is strict: `"temperature": "hot"` or `"max_tokens": "5"`
is a 400, not a silent conversion. Value ranges come from the engine's own bounds
(`SAMPLING_BOUNDS`, one source of truth), with OpenAI's narrower ones where it has them
(temperature <= 2); they are in the OpenAPI document too. Unknown fields are ignored, as
OpenAI does.
"""

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from kvdeck.engine.types.sampling_params import (
    INT64_MAX,
    LOGIT_BIAS_RANGE,
    MAX_LOGIT_BIAS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    SAMPLING_BOUNDS,
)

MAX_PROMPTS = 256  # prompts in one /v1/completions request (each choice is a queued request)
MAX_MESSAGES = 4096
OPENAI_MAX_TEMPERATURE = 2.0


def bounded(kind: str, name: str, high: float | None = None) -> Any:
    """An "int" or a "number" within the engine's range for `name` (narrowed to `high`)."""
    bound = SAMPLING_BOUNDS[name]
    limits: dict[str, float] = {}
    if bound.low is not None:
        limits["gt" if bound.low_open else "ge"] = bound.low
    top = bound.high if high is None else high
    if top is not None:
        limits["le"] = top
    if kind == "int":
        return Annotated[StrictInt, Field(**limits)]
    # Each branch carries the range, so the OpenAPI document states it (minimum, maximum).
    real = Annotated[StrictFloat, Field(allow_inf_nan=False, **limits)]
    return real | Annotated[StrictInt, Field(**limits)]


Number = Annotated[StrictFloat, Field(allow_inf_nan=False)] | StrictInt
BiasValue = (Annotated[StrictFloat, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE, allow_inf_nan=False)]
             | Annotated[StrictInt, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)])


def unsupported(**schema: object) -> Any:
    """Document the values served without enforcing them here: the route refuses the rest
    with a 400 that names the option (clearer than a type error)."""
    return Field(json_schema_extra=schema)
def also_a_string(schema: dict) -> None:
    """For a list field whose validator also takes a string (made one item of it): the
    OpenAPI document says so too."""
    items = dict(schema)
    schema.clear()
    schema["anyOf"] = [{"type": "string", "minLength": 1}, items]


TokenId = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (vLLM's extras included)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    max_tokens: bounded("int", "max_tokens") | None = None
    temperature: bounded("number", "temperature", OPENAI_MAX_TEMPERATURE) | None = None
    top_p: bounded("number", "top_p") | None = None
    top_k: bounded("int", "top_k") | None = None
    min_p: bounded("number", "min_p") | None = None
    presence_penalty: bounded("number", "presence_penalty") | None = None
    frequency_penalty: bounded("number", "frequency_penalty") | None = None
    repetition_penalty: bounded("number", "repetition_penalty") | None = None
    seed: bounded("int", "seed") | None = None
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: StrictBool = False
    min_tokens: bounded("int", "min_tokens") = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # vLLM's: the prompt's and each choice's token ids in the response (kvdeck attach counts
    # tokens with them)
    return_token_ids: StrictBool = False
    # vLLM's: each prompt token's logprob with this many top candidates, in the response's
    # `prompt_logprobs` (not with stream)
    prompt_logprobs: bounded("int", "prompt_logprobs") | None = None
    n: bounded("int", "n") = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None
    # OpenAI's: token id (as a string) -> a bias in [-100, 100] added to its logit
    logit_bias: Annotated[dict[Annotated[StrictStr, Field(pattern=r"^[0-9]{1,18}$")], BiasValue],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr = "response"
    description: StrictStr | None = None
    schema_: Annotated[dict, Field(alias="schema")] = Field(default_factory=dict)
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's: text, any JSON object, or JSON matching a schema."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(BaseModel):
    """vLLM's `structured_outputs`: exactly one of these."""

    model_config = ConfigDict(extra="ignore")
    json_: Annotated[dict | StrictStr | None, Field(alias="json")] = None
    regex: StrictStr | None = None
    choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: StrictStr | None = None
    parameters: dict | None = None
    strict: StrictBool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class GuidedFields(BaseModel):
    """vLLM's older names for structured outputs (guided_*), on both endpoints."""

    guided_json: dict | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    guided_grammar: StrictStr | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    response_format: ResponseFormat | None = None


class CompletionRequest(SamplingRequest, GuidedFields):
    prompt: (Annotated[StrictStr, Field(min_length=1)] | TokenIds
             | Annotated[list[Annotated[StrictStr, Field(min_length=1)]],
                         Field(min_length=1, max_length=MAX_PROMPTS)]
             | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)])
    # 0 only with echo: the prompt back, nothing generated (how clients score a text)
    max_tokens: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)] | None = None
    logprobs: bounded("int", "logprobs") | None = None
    echo: StrictBool = False  # the prompt before the completion (its logprobs too, with logprobs)
    suffix: Annotated[StrictStr, unsupported(maxLength=0)] | None = None
    best_of: Annotated[StrictInt, unsupported(minimum=1, maximum=1)] | None = None


class TextContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: StrictStr


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: StrictStr
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message. `content` may be null only on an assistant message with `tool_calls`
    (checked with the chat template, which also decides what the roles mean)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        # Said before the union's own errors, which would only say "a valid string".
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"content parts of type {kind!r} are not supported: "
                                     "kvdeck's models read text only (give parts of type 'text')")
        return content

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it (OpenAI's field names)."""
        message: dict = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(SamplingRequest, GuidedFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: bounded("int", "max_tokens") | None = None
    logprobs: StrictBool = False
    top_logprobs: bounded("int", "logprobs") | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    # vLLM's: more variables for the chat template ({"enable_thinking": false} for Qwen3)
    chat_template_kwargs: dict[StrictStr, Any] | None = None


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on inputs in one /v1/embeddings request
EmbeddingText = Annotated[StrictStr, Field(min_length=1)]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    input: (EmbeddingText | TokenIds
            | Annotated[list[EmbeddingText], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
            | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)])
    encoding_format: Literal["float", "base64"] = "float"  # the openai client asks for base64
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None  # only the model's own
    user: StrictStr | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: StrictBool = True
    chat_template_kwargs: dict[StrictStr, Any] | None = None  # with messages, as the chat route


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    tokens: Annotated[list[TokenId], Field(max_length=1 << 20)]

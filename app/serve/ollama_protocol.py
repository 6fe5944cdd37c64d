"""Request bodies of Ollama's API (/api/chat, /api/generate, /api/show, /api/pull), as pydantic models,
and what they mean to the engine: `options` to sampling params, `format` to a structured
output, Ollama's messages to the chat template's.

Ollama's clients send their whole option set; the ones that cannot apply to a running
kvdeck engine (memory and threading, context size: fixed when the server started) are
accepted and ignored, sampling methods the engine lacks are refused unless neutral, and a
misspelt option is a 400 naming it. Bodies are parsed here rather than by FastAPI, so
`curl -d` without a JSON content type works, as it does with Ollama.
"""

import json
from typing import Annotated, Literal, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from kvdeck.app.serve.errors import OpenAIError, bad_request
from kvdeck.app.serve.protocol import MAX_MESSAGES, Number, Tool, bounded
from kvdeck.engine.types.sampling_params import MAX_STOP_STRINGS, SamplingParams
from kvdeck.engine.types.structured import StructuredOutputsParams

# Options that cannot apply to an engine already running (its memory, threads and context
# length were set when the server started): accepted, as Ollama's clients send them.
IGNORED_OPTIONS = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "low_vram", "numa",
                   "vocab_only", "use_mmap", "use_mlock", "num_thread", "num_keep", "f16_kv",
                   "logits_all", "embedding_only", "repeat_last_n", "penalize_newline")
# Sampling methods the engine does not have: only their "off" value is accepted.
NEUTRAL_OPTIONS = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
_SAMPLING_PARAM_NAMES = frozenset({"temperature", "top_p", "top_k", "min_p", "seed", "max_tokens",
                                   "stop", "repetition_penalty", "presence_penalty",
                                   "frequency_penalty"})
_OPTION_NAMES = {"max_tokens": "num_predict", "repetition_penalty": "repeat_penalty"}


class OllamaOptions(BaseModel):
    """Ollama's `options` (its Modelfile parameters)."""

    model_config = ConfigDict(extra="forbid")  # a misspelt option must not pass unnoticed

    temperature: bounded("number", "temperature") | None = None
    top_p: bounded("number", "top_p") | None = None
    top_k: bounded("int", "top_k") | None = None
    min_p: bounded("number", "min_p") | None = None
    seed: bounded("int", "seed") | None = None  # negative: a random seed, as Ollama's -1
    num_predict: StrictInt | None = None  # -1 (no limit) and -2 (fill the context): to the end
    stop: Annotated[list[StrictStr], Field(max_length=MAX_STOP_STRINGS)] | StrictStr | None = None
    repeat_penalty: bounded("number", "repetition_penalty") | None = None
    presence_penalty: bounded("number", "presence_penalty") | None = None
    frequency_penalty: bounded("number", "frequency_penalty") | None = None
    typical_p: Number | None = None
    tfs_z: Number | None = None
    mirostat: StrictInt | None = None
    mirostat_tau: Number | None = None  # only read with mirostat on, which is refused
    mirostat_eta: Number | None = None
    num_ctx: StrictInt | None = None
    num_batch: StrictInt | None = None
    num_gpu: StrictInt | None = None
    main_gpu: StrictInt | None = None
    low_vram: StrictBool | None = None
    numa: StrictBool | None = None
    vocab_only: StrictBool | None = None
    use_mmap: StrictBool | None = None
    use_mlock: StrictBool | None = None
    num_thread: StrictInt | None = None
    num_keep: StrictInt | None = None
    f16_kv: StrictBool | None = None
    logits_all: StrictBool | None = None
    embedding_only: StrictBool | None = None
    repeat_last_n: StrictInt | None = None
    penalize_newline: StrictBool | None = None

    def sampling_params(self, structured: StructuredOutputsParams | None,
                        logprobs: int | None = None) -> SamplingParams:
        for name, neutral in NEUTRAL_OPTIONS.items():
            value = getattr(self, name)
            if value is not None and value != neutral:
                raise OpenAIError(400, f"options.{name} {value} is not supported (the engine has no "
                                       f"such sampler); leave it out or give {neutral}",
                                  param=f"options.{name}")
        # max_tokens None: to the end of the context (admission sets it), as Ollama's -1
        values = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p, "repetition_penalty": self.repeat_penalty,
                  "presence_penalty": self.presence_penalty,
                  "frequency_penalty": self.frequency_penalty,
                  "seed": self.seed if self.seed is not None and self.seed >= 0 else None,
                  "max_tokens": self.num_predict if self.num_predict is not None
                  and self.num_predict >= 0 else None}
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        try:
            return SamplingParams(stop=stop, structured_outputs=structured, logprobs=logprobs,
                                  max_tokens=values.pop("max_tokens"),
                                  **{k: v for k, v in values.items() if v is not None})
        except ValueError as exc:
            error = bad_request(exc, _SAMPLING_PARAM_NAMES)
            if error.param is not None:  # the engine's name; the client gave Ollama's
                option = _OPTION_NAMES.get(error.param, error.param)
                error.message = error.message.replace(error.param, f"options.{option}", 1)
                error.param = f"options.{option}"
            raise error from None


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    arguments: dict = Field(default_factory=dict)


class OllamaToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    function: ToolCallFunction


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr = ""
    images: list[StrictStr] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: StrictStr | None = None  # a tool message: the tool whose result it is
    thinking: StrictStr | None = None  # a past reply's reasoning: not shown to the template

    def for_template(self, index: int) -> dict:
        """The message as chat templates read it (OpenAI's field names and shapes)."""
        message: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": f"call_{index}_{j}", "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": json.dumps(call.function.arguments)}}
                for j, call in enumerate(self.tool_calls)]
        if self.role == "tool" and self.tool_name is not None:
            message["name"] = self.tool_name
        return message


class OllamaRequest(BaseModel):
    """Fields /api/chat and /api/generate share."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    format: Literal["", "json"] | dict | None = None
    options: OllamaOptions = Field(default_factory=OllamaOptions)
    stream: StrictBool = True
    keep_alive: StrictStr | Number | None = None  # the model stays loaded while the server runs
    think: StrictBool | StrictStr | None = None
    logprobs: StrictBool = False  # each generated token's, in the reply's `logprobs`
    top_logprobs: bounded("int", "logprobs") | None = None  # with logprobs: alternatives per token

    @property
    def thinks(self) -> bool | None:
        """think as a bool (None: not given)."""
        return None if self.think in (None, "") else self.think in (True, "true")

    @property
    def num_logprobs(self) -> int | None:
        """The engine's `logprobs` (None: none asked for)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class OllamaChatRequest(OllamaRequest):
    messages: Annotated[list[OllamaMessage], Field(max_length=MAX_MESSAGES)] = Field(default_factory=list)
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None


class OllamaGenerateRequest(OllamaRequest):
    prompt: StrictStr = ""
    suffix: StrictStr = ""
    system: StrictStr | None = None
    template: StrictStr = ""
    context: list[StrictInt] | None = None
    raw: StrictBool = False
    images: list[StrictStr] | None = None


class OllamaEmbedRequest(BaseModel):
    """/api/embed (`input`) and the older /api/embeddings (`prompt`, one text)."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr
    input: StrictStr | Annotated[list[StrictStr], Field(max_length=2048)] = ""
    prompt: StrictStr = ""
    truncate: StrictBool = True  # a text past the context is cut to fit (false: a 400)
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    options: dict | None = None  # sampling options: nothing to sample
    keep_alive: StrictStr | Number | None = None


class OllamaShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = Field(None, validation_alias=AliasChoices("model", "name"))  # older: name
    verbose: StrictBool = False


class OllamaPullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = Field(None, validation_alias=AliasChoices("model", "name"))  # older: name
    insecure: StrictBool = False
    stream: StrictBool = True


def format_spec(fmt: str | dict | None) -> StructuredOutputsParams | None:
    """`format`: "json" (any JSON object) or a JSON schema; "" or absent: free text."""
    if not fmt:
        return None
    try:
        return StructuredOutputsParams(json_object=True) if fmt == "json" \
            else StructuredOutputsParams(json=fmt)
    except ValueError as exc:
        raise OpenAIError(400, f"format: {exc}", param="format") from None


def refuse_unsupported(req: OllamaRequest, images: bool) -> None:
    """400 for what this server cannot do, naming the field."""
    if images:
        raise OpenAIError(400, "images are not supported: kvdeck serves text-only models",
                          param="images")
    if req.think not in (None, True, False, "", "true", "false"):
        raise OpenAIError(400, f"think {req.think!r} is not supported: thinking levels are "
                               "gpt-oss's; give true or false", param="think")
    if req.top_logprobs and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")


Body = TypeVar("Body", bound=BaseModel)


async def parse_body(raw: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model`, whatever its content type says; errors as the
    OpenAI routes word them (the handlers give them Ollama's shape under /api/)."""
    body = await raw.body()
    if not body.strip():
        raise OpenAIError(400, "missing request body")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"malformed JSON body: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None

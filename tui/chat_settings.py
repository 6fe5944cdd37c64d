"""The chat's settings: system prompt, sampling parameters (validated like SamplingParams),
the response format (free text, any JSON object, or a JSON schema read from a file) and the
LoRA adapter the replies run under (with an engine started with LoRA on)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.sampling_params import SamplingParams

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
AUTO_MAX_TOKENS_SHARE = 4  # auto max_tokens: a quarter of the context, the rest for history
AUTO_MAX_TOKENS_CAP = 1024  # ...but no more than this on long-context models
MIN_REPLY_TOKENS = 16  # a message that leaves less room than this for the reply is refused
RESPONSE_FORMATS = ("text", "json", "schema")  # free, any JSON object, a schema from a file
MAX_SCHEMA_BYTES = 1 << 20


def auto_max_tokens(max_model_len: int) -> int:
    """The reply budget when the user sets none: a share of the context, so a conversation
    keeps a few turns of history."""
    return max(1, min(AUTO_MAX_TOKENS_CAP, max_model_len // AUTO_MAX_TOKENS_SHARE))


@dataclass(slots=True)
class ChatSettings:
    """Checked by SamplingParams in parse() and sampling_params(), not on construction:
    the UI starts before it needs the engine's types."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int | None = None  # None: auto_max_tokens(max_model_len)
    seed: int | None = None
    response_format: str = "text"  # one of RESPONSE_FORMATS
    schema_file: str | None = None  # the JSON schema's file, with response_format "schema"
    adapter: str | None = None  # a LoRA adapter's folder (None: the base model)
    thinking: bool = True  # False: the template's enable_thinking false (Qwen3's switch)

    def reply_budget(self, max_model_len: int) -> int:
        return self.max_tokens if self.max_tokens is not None else auto_max_tokens(max_model_len)

    def sampling_params(self, max_tokens: int | None = None) -> SamplingParams:
        """The request's parameters; `max_tokens` is the budget fitted to the context
        (without one, and with auto max_tokens, SamplingParams' default)."""
        from kvdeck.engine.types.sampling_params import SamplingParams

        if max_tokens is None:
            max_tokens = self.max_tokens
        extra: dict = {} if max_tokens is None else {"max_tokens": max_tokens}
        constraint = self.structured_outputs()
        if constraint is not None:
            extra["structured_outputs"] = constraint
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                              **extra)

    def template_kwargs(self) -> dict | None:
        """The chat template's extra variables for a request (None: the template's defaults)."""
        return None if self.thinking else {"enable_thinking": False}

    def structured_outputs(self):
        """The grammar the reply must match (None: free text). The schema file is read on
        every message, so editing it takes effect at once; ValueError names its problem."""
        from kvdeck.engine.types.structured import StructuredOutputsParams

        if self.response_format == "text":
            return None
        if self.response_format == "json":
            return StructuredOutputsParams(json_object=True)
        if self.response_format != "schema":
            raise ValueError(f"response_format must be one of {RESPONSE_FORMATS}, "
                             f"got {self.response_format!r}")
        return StructuredOutputsParams(json=read_schema(self.schema_file))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> ChatSettings:
        """ValueError naming the bad field (a hand-edited settings file, say)."""
        if not isinstance(data, dict):
            raise ValueError("chat settings must be a JSON object")
        default = cls()
        max_tokens, seed = data.get("max_tokens"), data.get("seed")
        schema_file, adapter = data.get("schema_file"), data.get("adapter")
        thinking = data.get("thinking", default.thinking)
        if not isinstance(thinking, bool):
            raise ValueError(f"thinking must be true or false, got {thinking!r}")
        return cls.parse(
            str(data.get("system_prompt", default.system_prompt)),
            str(data.get("temperature", default.temperature)),
            str(data.get("top_p", default.top_p)),
            "" if max_tokens is None else str(max_tokens),
            "" if seed is None else str(seed),
            str(data.get("response_format", default.response_format)),
            "" if schema_file is None else str(schema_file),
            "" if adapter is None else str(adapter),
            thinking,
        )

    @classmethod
    def parse(cls, system_prompt: str, temperature: str, top_p: str, max_tokens: str,
              seed: str, response_format: str = "text", schema_file: str = "",
              adapter: str = "", thinking: bool = True) -> ChatSettings:
        """Build from the settings form's text fields (blank max_tokens: auto, blank seed:
        random); ValueError names the bad field."""
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"response format must be one of {RESPONSE_FORMATS}, "
                             f"got {response_format!r}")
        if response_format == "schema" and not schema_file.strip():
            raise ValueError("a JSON schema response format needs the schema's file")
        settings = cls(
            system_prompt=system_prompt,
            temperature=_parse_float("temperature", temperature),
            top_p=_parse_float("top_p", top_p),
            max_tokens=None if not max_tokens.strip() else _parse_int("max_tokens", max_tokens),
            seed=None if not seed.strip() else _parse_int("seed", seed),
            response_format=response_format,
            schema_file=schema_file.strip() or None,
            adapter=adapter.strip() or None,
            thinking=thinking,
        )
        settings.sampling_params()  # SamplingParams' own checks, and the schema's
        return settings


def read_schema(path: str | None) -> str:
    """A JSON schema file's text, checked to be a JSON object; ValueError says what is wrong."""
    if not path:
        raise ValueError("no schema file given")
    file = Path(path).expanduser()
    try:
        if file.stat().st_size > MAX_SCHEMA_BYTES:
            raise ValueError(f"schema file {path} is over {MAX_SCHEMA_BYTES // 1024} KiB")
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read schema file {path}: {exc.strerror or exc}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"schema file {path} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"schema file {path} must hold a JSON object (a JSON schema)")
    return json.dumps(schema)  # its keys in the file's order: the output's properties follow it


def _parse_float(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None

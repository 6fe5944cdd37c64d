"""What a request's output must match: a JSON schema, any JSON object, a regex, one of a
few strings, or a grammar (GBNF/EBNF or Lark), as vLLM's `structured_outputs`.

Light (no grammar library here): the front-end checks the grammar when the request
arrives, the core compiles and enforces it (kvdeck.engine.grammar).
"""

import json
from dataclasses import dataclass

MAX_GRAMMAR_CHARS = 1 << 20  # schemas and grammars up to 1 MiB of text


@dataclass(slots=True, frozen=True)
class StructuredOutputsParams:
    # A JSON schema, serialised (dicts are serialised on construction, their keys in the
    # order given: a model writes an object's properties in the order the schema lists them).
    json: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # GBNF / EBNF (llama.cpp's) or Lark
    json_object: bool = False  # any JSON object

    def __post_init__(self) -> None:
        if isinstance(self.json, dict | list | bool):
            object.__setattr__(self, "json", json.dumps(self.json))
        if self.choice is not None and not isinstance(self.choice, tuple):
            object.__setattr__(self, "choice", tuple(self.choice))
        self.validate()

    @property
    def kind(self) -> str:
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        return "json_object"

    def validate(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar") if getattr(self, name) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("structured_outputs must give exactly one of json, regex, choice, "
                             f"grammar, json_object; got {', '.join(given) or 'none'}")
        for name in ("json", "regex", "grammar"):
            text = getattr(self, name)
            if text is not None and (not isinstance(text, str) or not text):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
            if text is not None and len(text) > MAX_GRAMMAR_CHARS:
                raise ValueError(f"structured_outputs.{name} is {len(text)} characters; at most "
                                 f"{MAX_GRAMMAR_CHARS}")
        if self.choice is not None and (not self.choice or not all(
                isinstance(c, str) and c for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of non-empty strings")

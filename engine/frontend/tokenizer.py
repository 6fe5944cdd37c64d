"""Tokenizer loading and prompt preparation (the front-end's)."""

from pathlib import Path

from kvdeck.engine.frontend.chat import check_unicode
from kvdeck.engine.types.prompts import PROMPT_FORMS
from kvdeck.engine.types.request_limits import are_token_ids


class NoTokenizer:
    """Stands in where a model has no tokenizer (a bare config with dummy weights):
    prompts must be token ids and outputs carry no text."""

    eos_token_id = None
    chat_template = None

    def encode(self, text: str) -> list[int]:
        raise ValueError("this model has no tokenizer; give prompts as token ids")

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def load_tokenizer(model_dir: Path, tokenizer: str | None = None, required: bool = True):
    from transformers import AutoTokenizer

    source = tokenizer or str(model_dir)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        if not required:
            return NoTokenizer()
        raise ValueError(f"cannot load a tokenizer from {source}: {exc}") from exc


def max_chars_per_token(tokenizer) -> int | None:
    """The most characters one token can stand for (its longest vocabulary entry; byte-level
    BPE entries have one character per byte), None without a vocabulary."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if get_vocab is not None else None
    return max(map(len, vocab), default=1) if vocab else None


def tokenizer_eos_ids(tokenizer) -> list[int]:
    """The tokenizer's own end-of-sequence id (added to the model's for every request)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else []


def encode_prompt(tokenizer, prompt: str | list[int]) -> tuple[str | None, list[int]]:
    """(prompt text or None, token ids). Token-id prompts are passed through."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt must not be empty")
        check_unicode(prompt, "prompt")
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, list | tuple) and are_token_ids(prompt):
        if not prompt:
            raise ValueError("prompt must not be empty")
        return None, list(prompt)
    raise ValueError(f"prompt must be {PROMPT_FORMS}; got {prompt!r:.80}")

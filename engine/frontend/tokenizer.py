"""Tokenizer loading and prompt preparation (the front-end's)."""

from pathlib import Path


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


def tokenizer_eos_ids(tokenizer) -> list[int]:
    """The tokenizer's own end-of-sequence id (added to the model's for every request)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) else []


def encode_prompt(tokenizer, prompt: str | list[int]) -> tuple[str | None, list[int]]:
    """(prompt text or None, token ids). Token-id prompts are passed through."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt must not be empty")
        return prompt, tokenizer.encode(prompt)
    is_ids = isinstance(prompt, list | tuple) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt
    )
    if is_ids:
        if not prompt:
            raise ValueError("prompt must not be empty")
        return None, list(prompt)
    raise ValueError("prompt must be a string or a list of token ids")


def apply_chat_template(tokenizer, messages: list[dict]) -> list[int]:
    """Render a conversation with the tokenizer's chat template, ready for the reply."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] must have 'role' and 'content'")
        if message["role"] not in ("system", "user", "assistant", "tool", "developer"):
            raise ValueError(f"messages[{i}].role {message['role']!r} is not a known role")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}].content must be a string")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use a plain completion")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)

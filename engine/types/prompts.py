"""The prompt forms the Python API takes, vLLM's: a string, a list of token ids, a
`TextPrompt` {"prompt": text} or a `TokensPrompt` {"prompt_token_ids": [...]}.

`parse_prompt` turns one of them into a string or a list of ids (the front-end's two
forms); `batch_prompts` tells one prompt from a list of them. Keys vLLM uses for images
and audio are refused by name: kvdeck runs text-only models.
"""

from typing import Required, TypedDict


class TextPrompt(TypedDict, total=False):
    prompt: Required[str]


class TokensPrompt(TypedDict, total=False):
    prompt_token_ids: Required[list[int]]


PromptType = str | list[int] | TextPrompt | TokensPrompt

# vLLM's multimodal keys: refused with the reason rather than as unknown keys.
_MULTIMODAL_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids")
PROMPT_FORMS = ("a string, a list of token ids, a TextPrompt {'prompt': ...} "
          "or a TokensPrompt {'prompt_token_ids': [...]}")


def parse_prompt(prompt: object) -> object:
    """A dict prompt's string or token ids; anything else as it is (the front-end checks
    strings and ids). ValueError for a dict with a missing, unknown or unsupported key."""
    if not isinstance(prompt, dict):
        return prompt
    for key in prompt:
        if key in _MULTIMODAL_KEYS:
            raise ValueError(f"{key} is not supported: kvdeck serves text-only models")
        if key not in ("prompt", "prompt_token_ids"):
            raise ValueError(f"unknown prompt key {key!r}: a prompt dict holds 'prompt' (a "
                             "TextPrompt) or 'prompt_token_ids' (a TokensPrompt)")
    if "prompt" in prompt and "prompt_token_ids" in prompt:
        raise ValueError("a prompt dict holds either 'prompt' or 'prompt_token_ids', not both")
    if "prompt" in prompt:
        if not isinstance(prompt["prompt"], str):
            raise ValueError(f"TextPrompt 'prompt' must be a string, got {prompt['prompt']!r}")
        return prompt["prompt"]
    if "prompt_token_ids" in prompt:
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, list | tuple):
            raise ValueError(f"TokensPrompt 'prompt_token_ids' must be a list of token ids, got {ids!r}")
        return list(ids)
    raise ValueError("a prompt dict needs 'prompt' (a TextPrompt) or 'prompt_token_ids' (a TokensPrompt)")


def is_single_prompt(prompts: object) -> bool:
    """Whether `prompts` is one prompt (a string, a dict, a list of ints) rather than a list."""
    if isinstance(prompts, str | dict):
        return True
    return isinstance(prompts, list | tuple) and bool(prompts) and isinstance(prompts[0], int)


def batch_prompts(prompts: object) -> list:
    """One prompt or a list of them, as a non-empty list; ValueError otherwise."""
    if is_single_prompt(prompts):
        return [prompts]
    if not isinstance(prompts, list | tuple) or not prompts:
        raise ValueError(f"prompts must be {PROMPT_FORMS}, or a non-empty list of those; got {prompts!r:.80}")
    return list(prompts)

"""Fit a conversation into the model's context before it is sent.

The prompt (system prompt, history, the new message, through the chat template) plus the
reply's `max_tokens` must fit in `max_model_len`. The oldest turns are left out first
(whole user/assistant exchanges, so the history still starts with a user turn); when even
the new message alone leaves too little room for a reply it is refused, with its token
count, before anything reaches the engine. The transcript itself is never cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvdeck.tui.chat_settings import MIN_REPLY_TOKENS
from kvdeck.tui.transcripts import ChatTurn

CountTokens = Callable[[list[dict[str, str]]], int]  # chat messages -> prompt tokens


class MessageTooLong(ValueError):
    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len
        super().__init__(
            f"Not sent: this message is {prompt_tokens} tokens with the system prompt and chat "
            f"template; the model's context is {max_model_len} tokens and the reply needs at "
            f"least {MIN_REPLY_TOKENS}. Shorten it."
        )


@dataclass(frozen=True, slots=True)
class FittedRequest:
    messages: list[dict[str, str]]
    prompt_tokens: int
    max_tokens: int  # the reply budget, lowered only when no history is left to drop
    dropped: int  # earlier messages left out of this request


def fit_to_context(count_tokens: CountTokens, max_model_len: int, system_prompt: str,
                   history: Sequence[ChatTurn], message: str, reply_budget: int) -> FittedRequest:
    """The request to send for `message` after `history`; MessageTooLong if it cannot fit."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    # A turn with nothing in it (a reply that failed before its first token) adds nothing.
    earlier = [{"role": t.role, "content": t.content} for t in history if t.content.strip()]
    new = {"role": "user", "content": message}
    budget = max(1, min(reply_budget, max_model_len - 1))
    # Where the kept history may start: at a user turn, or nowhere (no history at all).
    starts = [i for i, m in enumerate(earlier) if m["role"] == "user"] + [len(earlier)]
    if earlier and earlier[0]["role"] != "user":
        starts.insert(0, 0)
    counted: dict[int, int] = {}

    def tokens(start: int) -> int:
        if start not in counted:
            counted[start] = count_tokens([*system, *earlier[start:], new])
        return counted[start]

    def fits(start: int) -> bool:
        return tokens(start) + budget <= max_model_len

    if not fits(starts[-1]):  # no history left to drop: shorten the reply, or refuse
        alone = tokens(starts[-1])
        if alone + MIN_REPLY_TOKENS > max_model_len:
            raise MessageTooLong(alone, max_model_len)
        return FittedRequest([*system, new], alone, max_model_len - alone, len(earlier))
    # The fewest turns to leave out: tokens fall as the start moves later (binary search).
    low, high = 0, len(starts) - 1
    while low < high:
        mid = (low + high) // 2
        if fits(starts[mid]):
            high = mid
        else:
            low = mid + 1
    start = starts[low]
    return FittedRequest([*system, *earlier[start:], new], tokens(start), budget, start)

"""Incremental detokenisation and stop strings (client side, as in vLLM v1).

Text is decoded over a sliding window of ids: the new text is what the window decodes
to beyond its already-emitted prefix. A window whose text ends in U+FFFD is an
incomplete UTF-8 character (byte-level BPE split it): wait for the next token. Stop
strings are matched across token boundaries; the last len(longest stop) - 1
characters are held back so a stop string never leaks into a streamed delta.
"""

from dataclasses import dataclass, field

_INCOMPLETE = "\ufffd"
_PROMPT_CONTEXT_TOKENS = 5  # enough context for tokenizers that strip a leading space


@dataclass(slots=True)
class IncrementalDetokenizer:
    tokenizer: object
    prompt_token_ids: list[int]
    skip_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    token_ids: list[int] = field(init=False)
    prefix_offset: int = field(init=False)
    read_offset: int = field(init=False)
    text: str = ""  # output text so far (after a stop string match: truncated)
    emitted: int = 0  # characters of `text` already handed out
    stop_reason: str | None = None
    # Of the last add_tokens call's ids, how many were taken: all, or up to the one that
    # completed a stop string (a speculative step can bring several tokens past it).
    tokens_used: int = 0
    _decode: object = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._decode = _decoder(self.tokenizer)
        context = self.prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]
        self.token_ids = list(context)
        self.prefix_offset = 0
        self.read_offset = len(context)

    @property
    def holdback(self) -> int:
        return max((len(s) for s in self.stop), default=1) - 1

    def add_tokens(self, new_token_ids: list[int], finished: bool) -> str:
        """Append tokens; returns the new text safe to show. Sets stop_reason on a match."""
        self.tokens_used = 0
        if self.stop_reason is not None:
            return ""
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self.tokens_used += 1
            before = len(self.text)
            self.text += self._decode_next(force=False)
            self._match_stop(before)
            if self.stop_reason is not None:
                break  # the tokens after the one that completed the stop string are dropped
        if finished and self.stop_reason is None:
            before = len(self.text)
            self.text += self._decode_next(force=True)
            self._match_stop(before)
        end = len(self.text) if (finished or self.stop_reason) else max(
            self.emitted, len(self.text) - self.holdback
        )
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta

    def _decode_next(self, force: bool) -> str:
        decode = self._decode
        prefix = decode(self.token_ids[self.prefix_offset : self.read_offset],
                        skip_special_tokens=self.skip_special_tokens)
        full = decode(self.token_ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if len(full) <= len(prefix) or (full.endswith(_INCOMPLETE) and not force):
            return ""
        new_text = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        return new_text

    def _match_stop(self, previous_length: int) -> None:
        if not self.stop:
            return
        search_from = max(0, previous_length - self.holdback)
        best: tuple[int, str] | None = None
        for stop in self.stop:
            i = self.text.find(stop, search_from)
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is None:
            return
        index, stop = best
        self.text = self.text[: index + len(stop)] if self.include_stop_str_in_output else self.text[:index]
        self.emitted = min(self.emitted, len(self.text))
        self.stop_reason = stop


def _decoder(tokenizer):
    """`tokenizer.decode`, or the same call on its `tokenizers` backend where that is all
    transformers' decode would do (its fast tokenizer's own `_decode`, no spaces cleaned
    up): it skips transformers' argument conversion, half the cost of the two decodes a
    streamed token takes in the server's reader thread."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True) is not False:
        return tokenizer.decode
    try:  # the transformers method whose whole work is the backend's decode, checked, not assumed
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return tokenizer.decode
    if getattr(type(tokenizer), "_decode", None) is not TokenizersBackend._decode:
        return tokenizer.decode
    return backend.decode

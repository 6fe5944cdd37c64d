"""The core's grammar matchers: compiled off the step loop, cached by spec, one matcher per
constrained request, the batch's token bitmasks filled in one parallel call.

A request's grammar compiles in a background thread when it is added; until it is ready
the request waits in the queue while others run (the scheduler skips it). Each step the
core asks for the bitmask rows of the constrained requests that sample, and after
sampling feeds every accepted token to their matchers. Preemption keeps a matcher as it
is: the tokens it accepted stay the request's tokens, and recomputing them changes nothing.
"""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import llguidance as llg
import numpy as np

from kvdeck.engine.grammar.compile import grammar_definition
from kvdeck.engine.types.arith import cdiv
from kvdeck.engine.types.structured import StructuredOutputsParams

logger = logging.getLogger(__name__)
CACHED_GRAMMARS = 256  # compiled specs kept (least recently used dropped)


@dataclass(slots=True)
class GrammarState:
    """One request's grammar: its compilation, then its own matcher."""

    compiled: Future  # -> a template LLMatcher
    submitted: float = field(default_factory=time.perf_counter)
    compile_s: float | None = None  # from submission to ready (queueing in the thread included)
    matcher: llg.LLMatcher | None = None

    @property
    def ready(self) -> bool:
        return self.compiled.done()

    @property
    def error(self) -> str | None:
        if not self.compiled.done() or self.compiled.exception() is None:
            return None
        return str(self.compiled.exception())


class GrammarManager:
    def __init__(self, tokenizer_source: str, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokenizer_source = tokenizer_source
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.bitmask_words = cdiv(vocab_size, 32)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvdeck-grammar")
        self._tokenizer: llg.LLTokenizer | None = None  # built in the pool, on first use
        self._compiled: dict[StructuredOutputsParams, Future] = {}
        self._executor = llg.LLExecutor()

    def start(self, spec: StructuredOutputsParams) -> GrammarState:
        """Begin compiling `spec` (or reuse its compilation); never blocks."""
        future = self._compiled.pop(spec, None)
        if future is None or (future.done() and future.exception() is not None):
            future = self._pool.submit(self._compile, spec)
        self._compiled[spec] = future  # most recently used last
        while len(self._compiled) > CACHED_GRAMMARS:
            self._compiled.pop(next(iter(self._compiled)))
        state = GrammarState(future)
        future.add_done_callback(lambda _: _mark_compiled(state))
        return state

    def _compile(self, spec: StructuredOutputsParams) -> llg.LLMatcher:
        if self._tokenizer is None:  # here, not at import: the engine starts without transformers
            import llguidance.hf
            from transformers import AutoTokenizer

            hf_tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_source)
            self._tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=self.vocab_size,
                                                           eos_token=self.eos_token_ids)
        matcher = llg.LLMatcher(self._tokenizer, grammar_definition(spec), log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher

    def matcher(self, state: GrammarState) -> llg.LLMatcher:
        if state.matcher is None:
            state.matcher = state.compiled.result().deep_copy()
        return state.matcher

    def fill_bitmask(self, states: list[GrammarState]) -> np.ndarray:
        """int32 [len(states), ceil(vocab / 32)]: bit t of row i allows token t."""
        bitmask = np.full((len(states), self.bitmask_words), -1, dtype=np.int32)
        if states:
            jobs = [(self.matcher(state), row) for row, state in enumerate(states)]
            self._executor.unsafe_compute_mask_ptr(jobs, bitmask.ctypes.data, self.bitmask_words * 4,
                                                   len(states))
        return bitmask

    def accept(self, state: GrammarState, token_id: int) -> bool:
        """Advance by a sampled token; True once the grammar is complete (nothing but the end
        of the sequence may follow) or the token broke it."""
        matcher = self.matcher(state)
        if not matcher.consume_token(token_id):
            logger.error("a constrained request sampled a token its grammar refused: %s",
                         matcher.get_error())
            return True
        return matcher.is_stopped()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _mark_compiled(state: GrammarState) -> None:
    state.compile_s = time.perf_counter() - state.submitted

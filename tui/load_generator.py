"""Synthetic load: N concurrent requests of random token prompts, to watch batching happen.

Each burst draws fresh prompts (a new seed, shown, unless the user fixes one), so a second
burst does not just hit the prefix cache. A shared prefix (the same first tokens in every
prompt) makes prefix-cache sharing visible in the block map: one leader request goes first
and the others follow once its prompt is computed, because the engine registers a block
in the prefix cache only after computing it (requests admitted in the same step share
nothing). With enough requests the pool runs out and preemption shows up too.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvdeck.tui.reply_meter import ReplyMeter

if TYPE_CHECKING:
    from kvdeck.tui.dashboard_state import DashboardState
    from kvdeck.tui.engine_protocol import EngineClientProtocol

MAX_REQUESTS = 512


@dataclass(slots=True)
class LoadSpec:
    num_requests: int = 16
    prompt_tokens: int = 128
    output_tokens: int = 64
    shared_prefix_tokens: int = 32
    seed: int | None = None  # None: a fresh seed for every burst

    def validate(self, max_model_len: int | None = None) -> None:
        for name in ("num_requests", "prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_requests > MAX_REQUESTS:
            raise ValueError(
                f"num_requests must be at most {MAX_REQUESTS}, got {self.num_requests}"
            )
        if not isinstance(self.shared_prefix_tokens, int) or not (
            0 <= self.shared_prefix_tokens <= self.prompt_tokens
        ):
            raise ValueError(
                f"shared_prefix_tokens must be in [0, prompt_tokens={self.prompt_tokens}], "
                f"got {self.shared_prefix_tokens!r}"
            )
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer or blank, got {self.seed!r}")
        if max_model_len is not None and self.prompt_tokens + self.output_tokens > max_model_len:
            raise ValueError(
                f"prompt_tokens + output_tokens must be <= max_model_len ({max_model_len}), "
                f"got {self.prompt_tokens + self.output_tokens}"
            )


def synthetic_prompts(spec: LoadSpec, vocab: int | list[int], seed: int) -> list[list[int]]:
    """Random token-id prompts; the first `shared_prefix_tokens` are the same in all. `vocab`
    is the vocabulary size, or a list of ids known to be valid (an attached server that
    does not say its size)."""
    rng = random.Random(seed)
    if isinstance(vocab, list):
        if not vocab:
            raise ValueError("no valid token ids to draw prompts from")

        def draw() -> int:
            return rng.choice(vocab)
    else:
        if vocab < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab}")
        low = min(3, vocab - 1)  # skip the usual special ids (pad, bos, eos) at the bottom

        def draw() -> int:
            return rng.randrange(low, vocab)
    prefix = [draw() for _ in range(spec.shared_prefix_tokens)]
    tail = spec.prompt_tokens - spec.shared_prefix_tokens
    return [prefix + [draw() for _ in range(tail)] for _ in range(spec.num_requests)]


@dataclass(slots=True)
class LoadResult:
    seed: int = 0
    completed: int = 0
    aborted: int = 0  # stopped, or never sent because the burst was stopped first
    failed: int = 0
    output_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def new_seed() -> int:
    return random.SystemRandom().randrange(1, 100_000)


@dataclass(slots=True)
class LoadGenerator:
    client: EngineClientProtocol
    state: DashboardState | None = None
    burst: int = 0  # bursts fired so far: keeps request ids unique across bursts
    in_flight: set[str] = field(default_factory=set)
    _stopped: bool = False

    @property
    def running(self) -> bool:
        return bool(self.in_flight)

    async def run(self, spec: LoadSpec, seed: int | None = None) -> LoadResult:
        """Fire one burst (seed: `seed`, else the spec's, else a fresh one) and wait for it."""
        from kvdeck.engine.types.sampling_params import SamplingParams

        spec.validate(getattr(self.client, "max_model_len", None))
        seed = seed if seed is not None else spec.seed if spec.seed is not None else new_seed()
        prompts = synthetic_prompts(spec, _token_choices(self.client), seed)
        params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, temperature=1.0,
                                seed=seed)
        self.burst += 1
        burst = self.burst
        self._stopped = False
        result = LoadResult(seed=seed)

        async def one(index: int, prompt: list[int], started: asyncio.Event | None = None) -> None:
            request_id = f"load{burst}-{index}"
            meter = ReplyMeter(self.state)
            self.in_flight.add(request_id)
            try:
                async for out in self.client.generate(prompt, params, request_id=request_id):
                    meter.observe(out)
                    if started is not None:
                        started.set()  # its prompt is computed: its full blocks are cached
            except Exception as exc:  # one failed request must not hide the others' results
                result.failed += 1
                result.errors.append(f"{request_id}: {exc}")
                return
            finally:
                self.in_flight.discard(request_id)
            result.output_tokens += meter.num_tokens
            if meter.finish_reason == "abort":
                result.aborted += 1
            else:
                result.completed += 1

        tasks = []
        if spec.shared_prefix_tokens and len(prompts) > 1:
            started = asyncio.Event()
            leader = asyncio.ensure_future(one(0, prompts[0], started))
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait({leader, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            tasks.append(leader)
            prompts = prompts[1:]
            first_index = 1
        else:
            first_index = 0
        if self._stopped:  # stopped while the leader ran: the others never go out
            result.aborted += len(prompts)
            prompts = []
        tasks += [asyncio.ensure_future(one(first_index + i, p)) for i, p in enumerate(prompts)]
        await asyncio.gather(*tasks)
        return result

    async def stop(self) -> None:
        """Abort every request of the running burst (their blocks are freed at once)."""
        self._stopped = True
        for request_id in list(self.in_flight):
            await self.client.abort(request_id)


def _token_choices(client: EngineClientProtocol) -> int | list[int]:
    """Token ids valid for both the tokenizer and the model (their sizes can differ): the
    smaller vocabulary size, or ids an attached server's tokenizer produced."""
    sizes = [int(n) for n in (getattr(client, "vocab_size", 0),
                              getattr(client.tokenizer, "vocab_size", 0)) if n]
    if sizes:
        return min(sizes)
    pool = list(getattr(client, "token_pool", None) or [])
    if pool:
        return pool
    raise ValueError("the engine reports no vocabulary size and cannot tokenize (no /tokenize): "
                     "the load generator cannot make valid prompts for it")

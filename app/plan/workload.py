"""What the planner serves: requests with arrival times, prompt token ids and output lengths.

A synthetic workload is users x conversation turns: each user's first turn arrives by a
Poisson process (`rate`) or within a ramp (closed loop), each later turn a think time after
the previous one finished, its prompt the whole conversation so far (so prefix caching sees
what a chat server sees) plus the user's new message. Prompt token ids matter to prefix
caching: a shared prefix (a system prompt) is explicit, the rest is random. Seeded.
"""

import random
from dataclasses import dataclass, field
from typing import Protocol

FIRST_TOKEN_ID = 3  # below: the special tokens of small vocabularies (bos, eos, pad)


@dataclass(slots=True)
class PlannedRequest:
    request_id: str
    arrival_s: float  # seconds from the workload's start
    prompt_token_ids: list[int]
    output_len: int  # tokens it generates (the engine runs it with ignore_eos)
    user: int = -1  # synthetic: its conversation
    turn: int = 0
    # A recording's: the engine step (its scheduler's count) that first scheduled it, so a
    # replay can add it before that step whatever the simulated clock says (simulate's by_step).
    arrival_step: int | None = None


class Workload(Protocol):
    description: str
    start_s: float  # the simulated clock starts here: what arrived by then is in the first step

    def initial(self) -> list[PlannedRequest]:
        """The requests known up front (the rest follow from finished turns)."""
        ...

    def follow_up(self, request: PlannedRequest, output_token_ids: list[int],
                  finished_s: float) -> PlannedRequest | None:
        """The next request once `request` finished at `finished_s` with that output."""
        ...


@dataclass(frozen=True, slots=True)
class Lengths:
    """A token count: fixed, or uniform in [low, high]."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str | int, what: str) -> "Lengths":
        """"256" or "100-1000"; ValueError naming `what` otherwise."""
        parts = str(text).split("-")
        try:
            low, high = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
        except ValueError:
            low, high = 0, -1
        if low <= 0 or high < low:
            raise ValueError(f"{what} must be a positive token count N or a range LOW-HIGH, got {text!r}")
        return cls(low, high)

    def draw(self, rng: random.Random) -> int:
        return self.low if self.low == self.high else rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"


@dataclass(slots=True)
class SyntheticWorkload:
    users: int
    prompt_len: Lengths  # the first turn's prompt (after the shared prefix)
    output_len: Lengths
    vocab_size: int
    max_model_len: int  # a conversation ends before a turn would pass it
    turns: int = 1
    turn_len: Lengths = Lengths(64, 64)  # each later turn's new user message
    shared_prefix: int = 0  # tokens every user's first prompt starts with (a system prompt)
    rate: float | None = None  # users' first turns per second (Poisson); None: within ramp_s
    ramp_s: float = 0.0
    think_time_s: float = 0.0  # mean (exponential) pause between a turn's end and the next
    seed: int = 0
    start_s: float = 0.0
    num_cut_short: int = 0  # conversations that ended early at max_model_len
    _rngs: list[random.Random] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("users", "turns", "vocab_size", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.shared_prefix < 0 or self.ramp_s < 0 or self.think_time_s < 0:
            raise ValueError("shared prefix, ramp and think time cannot be negative")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be positive (users per second), got {self.rate}")
        if self.vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"vocab_size {self.vocab_size} is too small")

    @property
    def description(self) -> str:
        start = f"Poisson {self.rate:g}/s" if self.rate else (
            f"within {self.ramp_s:g} s" if self.ramp_s else "at once")
        think = f", think {self.think_time_s:g} s" if self.turns > 1 else ""
        prefix = f", shared prefix {self.shared_prefix}" if self.shared_prefix else ""
        return (f"{self.users} users x {self.turns} turns (start {start}{think}); prompt "
                f"{self.prompt_len}{prefix}, later turns +{self.turn_len}, output {self.output_len}")

    def initial(self) -> list[PlannedRequest]:
        rng = random.Random(self.seed)
        prefix = self._tokens(rng, self.shared_prefix)
        self._rngs = [random.Random(rng.getrandbits(64)) for _ in range(self.users)]
        arrivals, t = [], 0.0
        for _ in range(self.users):
            if self.rate:
                t += rng.expovariate(self.rate)
                arrivals.append(t)
            else:
                arrivals.append(rng.uniform(0.0, self.ramp_s) if self.ramp_s else 0.0)
        requests = []
        for user, (arrival, user_rng) in enumerate(zip(arrivals, self._rngs)):
            prompt = prefix + self._tokens(user_rng, self.prompt_len.draw(user_rng))
            request = self._request(user, 0, arrival, prompt, user_rng)
            if request is not None:
                requests.append(request)
        return requests

    def follow_up(self, request: PlannedRequest, output_token_ids: list[int],
                  finished_s: float) -> PlannedRequest | None:
        if request.user < 0 or request.turn + 1 >= self.turns:
            return None
        rng = self._rngs[request.user]
        think = rng.expovariate(1.0 / self.think_time_s) if self.think_time_s else 0.0
        prompt = request.prompt_token_ids + list(output_token_ids) + \
            self._tokens(rng, self.turn_len.draw(rng))
        return self._request(request.user, request.turn + 1, finished_s + think, prompt, rng)

    def _request(self, user: int, turn: int, arrival: float, prompt: list[int],
                 rng: random.Random) -> PlannedRequest | None:
        output_len = self.output_len.draw(rng)
        if len(prompt) + output_len > self.max_model_len:
            self.num_cut_short += 1
            return None
        return PlannedRequest(f"u{user}t{turn}", arrival, prompt, output_len, user, turn)

    def _tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(FIRST_TOKEN_ID, self.vocab_size) for _ in range(n)]


@dataclass(slots=True)
class FixedWorkload:
    """Requests known in advance (a recording's): nothing follows from a finish."""

    requests: list[PlannedRequest]
    description: str = "fixed requests"
    start_s: float = 0.0  # when the engine's first step began (a recording says)

    def initial(self) -> list[PlannedRequest]:
        return list(self.requests)

    def follow_up(self, request: PlannedRequest, output_token_ids: list[int],
                  finished_s: float) -> PlannedRequest | None:
        return None

"""When and how far each request speculates, and what it has accepted so far.

Per request: never draft past `max_tokens` or `max_model_len` (a verified chunk emits up to
k + 1 tokens); when the acceptance rate of its last `acceptance_window` draft tokens is
below `min_acceptance_rate`, decode without drafts for `pause_steps` steps, then try again
(verifying drafts that are mostly rejected costs more than it saves). Under the gain policy
(draft_budget.py) there is no pause: each step keeps the drafts whose expected acceptance
pays for their rows, from the record kept here.
"""

from collections import deque
from dataclasses import dataclass, field

from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.draft_budget import AcceptanceRecord
from kvdeck.engine.types.speculative import SpeculativeConfig

HISTORY = 32  # accepted lengths kept per request (the request inspector's per-step view)


@dataclass(slots=True)
class RequestSpecState:
    num_drafts: int = 0  # verification steps that carried drafts
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    recent: deque[bool] = field(default_factory=deque)  # the last window's drafts: accepted?
    paused_steps: int = 0  # steps left without drafts
    accepted_history: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    # The gain policy's: recent verifies, the accepted tokens it predicted for the drafts it
    # kept this step, and its decision in words.
    acceptance: AcceptanceRecord = field(default_factory=AcceptanceRecord)
    predicted: float = 0.0
    decision: str = ""


class SpecPolicy:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.states: dict[str, RequestSpecState] = {}

    def state(self, request_id: str) -> RequestSpecState:
        state = self.states.get(request_id)
        if state is None:
            state = self.states[request_id] = RequestSpecState()
        return state

    def num_drafts(self, request: Request) -> int:
        """How many drafts this decode may carry this step (0: none)."""
        state = self.state(request.request_id)
        if state.paused_steps > 0:
            state.paused_steps -= 1
            return 0
        k = min(self.config.num_speculative_tokens, self.max_model_len - request.num_tokens - 1)
        max_tokens = request.params.max_tokens
        if max_tokens is not None:
            k = min(k, max_tokens - request.num_output_tokens - 1)
        return max(k, 0)

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """One verified chunk: `accepted` of its `drafted` drafts were accepted."""
        state = self.state(request_id)
        state.num_drafts += 1
        state.num_draft_tokens += drafted
        state.num_accepted_tokens += accepted
        state.accepted_history.append(accepted)
        if self.config.draft_policy == "gain":
            state.acceptance.verifies.append((drafted, accepted, state.predicted))
            return
        window = self.config.acceptance_window
        state.recent.extend([True] * accepted + [False] * (drafted - accepted))
        while len(state.recent) > window:
            state.recent.popleft()
        if len(state.recent) == window and sum(state.recent) < self.config.min_acceptance_rate * window:
            state.paused_steps = self.config.pause_steps
            state.recent.clear()

    def forget(self, request_id: str) -> None:
        self.states.pop(request_id, None)

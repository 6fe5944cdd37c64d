"""SpeculativeDecoder: what the EngineCore does for speculative decoding each step.

    propose(running)        before scheduling: drafts for each running decode (or none: the
                            batch is over disable_by_batch_size, or the policy says no; the
                            gain policy keeps those whose expected acceptance pays for them)
    discard(preempted)      after scheduling: preempted requests' drafts and draft K/V go
    account(batch, emitted) after the target ran: counters, and which slots held drafts
    after_update(...)       after the scheduler advanced: the proposer catches up (a draft
                            model rolls back to what the target accepted)
    observe_step(...)       the step's rows and time: what the gain policy prices rows by

It also keeps what the dashboard and /metrics read: vLLM's counters (drafts, draft tokens,
accepted tokens, accepted per position) and the last step's speculative slots.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvdeck.engine.core.request import Request
from kvdeck.engine.core.spec.draft_budget import best_draft_lengths
from kvdeck.engine.core.spec.policy import SpecPolicy
from kvdeck.engine.core.spec.proposer import Proposer
from kvdeck.engine.core.spec.step_cost import StepCostModel
from kvdeck.engine.types.spec_stats import RequestSpecStats, SpecDecodeStats
from kvdeck.engine.types.speculative import SpeculativeConfig


@dataclass(slots=True)
class SpecStep:
    """The last step's speculation, for the block map and the status line."""

    disabled: bool = False  # the running batch was over disable_by_batch_size
    draft_tokens: int = 0
    accepted_tokens: int = 0
    slots_written: list[int] = field(default_factory=list)  # slots that received draft K/V
    slots_rolled_back: list[int] = field(default_factory=list)  # of those, the rejected ones
    blocks_rolled_back: list[int] = field(default_factory=list)  # blocks given back for them


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_model_len: int,
                 block_size: int, exact_max_rows: int | None = None) -> None:
        """`exact_max_rows`: the most rows a step may have and keep a one-row step's bits (the
        CPU decoder stack's limit); the gain policy stays within it where the batch does."""
        self.config = config
        self.proposer = proposer
        self.policy = SpecPolicy(config, max_model_len)
        self.block_size = block_size
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.num_speculative_tokens
        self.last = SpecStep()
        self._proposed: list[Request] = []  # asked for drafts this step (verified or not)
        self.gain = config.draft_policy == "gain"
        self.step_cost = StepCostModel()
        self.exact_max_rows = exact_max_rows
        self.expected_speedup = 1.0

    # ---- the step -------------------------------------------------------------------
    def propose(self, running: Sequence[Request]) -> None:
        for request in running:
            request.spec_token_ids = []
        limit = self.config.disable_by_batch_size
        disabled = limit is not None and len(running) > limit
        self.last = SpecStep(disabled=disabled)
        if disabled:
            return
        chosen, ks = [], []
        for request in running:
            # A grammar constrains each token as it is sampled; drafts skip the constraint.
            if request.grammar is not None or request.is_prefilling:
                continue
            if (k := self.policy.num_drafts(request)) > 0:
                chosen.append(request)
                ks.append(k)
        for request, drafts in zip(chosen, self.proposer.propose(chosen, ks)):
            request.spec_token_ids = drafts
        self._proposed = chosen
        if self.gain:
            self._keep_drafts_that_pay(len(running), chosen)

    def _keep_drafts_that_pay(self, batch_rows: int, chosen: Sequence[Request]) -> None:
        """The gain policy: trim each draft to what pays for its rows this step."""
        estimates_of = getattr(self.proposer, "draft_estimates", None)
        estimates = estimates_of() if estimates_of is not None else {}
        states = [self.policy.state(r.request_id) for r in chosen]
        offers = [state.acceptance.acceptance(len(r.spec_token_ids), estimates.get(r.request_id))
                  for r, state in zip(chosen, states)]
        max_rows = self.exact_max_rows
        if max_rows is not None and batch_rows > max_rows:
            max_rows = None  # plain decoding is past the stack already
        lengths, self.expected_speedup = best_draft_lengths(offers, batch_rows, self.step_cost.cost,
                                                            max_rows)
        explore_after = max(self.config.pause_steps, 1)
        for request, state, offer, kept in zip(chosen, states, offers, lengths):
            request.spec_token_ids = request.spec_token_ids[:kept]
            state.predicted = sum(offer[:kept])
            if not offer:
                state.decision = "no drafts: nothing to propose"
            elif kept:
                state.decision = (f"verifying {kept} of {len(offer)} drafts: expects "
                                  f"{state.predicted:.1f} accepted")
                state.acceptance.steps_without_drafts = 0
            else:
                state.decision = (f"no drafts: {len(offer)} proposed, first expected "
                                  f"{offer[0]:.0%} accepted, not worth a row at batch {batch_rows}")
                state.acceptance.steps_without_drafts += 1
                if state.acceptance.steps_without_drafts >= explore_after:
                    state.acceptance.verifies.clear()  # try it again from the prior
                    state.acceptance.steps_without_drafts = 0

    def observe_step(self, prefill_tokens: int, rows: int, seconds: float) -> None:
        """A step ran: decode-only steps teach the gain policy what a row costs."""
        if self.gain and prefill_tokens == 0:
            self.step_cost.observe(rows, seconds)

    def draft_probs(self) -> dict[str, Any] | None:
        return self.proposer.draft_probs()

    def discard(self, preempted: Sequence[Request]) -> None:
        for request in preempted:
            self.proposer.on_preempted(request)

    def account(self, requests: Sequence[Request], emitted: Sequence[Sequence[Any] | None]) -> None:
        """Count what the target accepted (before the scheduler advances the requests):
        `emitted[i]` is what requests[i]'s chunk produced (None: no sample)."""
        bs = self.block_size
        step = self.last
        for request, tokens in zip(requests, emitted):
            drafted = len(request.spec_token_ids)
            if not drafted or tokens is None:
                continue
            accepted = len(tokens) - 1
            self.policy.record(request.request_id, drafted, accepted)
            self.num_drafts += 1
            self.num_draft_tokens += drafted
            self.num_accepted_tokens += accepted
            for pos in range(accepted):
                self.accepted_per_pos[pos] += 1
            step.draft_tokens += drafted
            step.accepted_tokens += accepted
            first = request.num_computed_tokens + 1  # the newest real token sits before the drafts
            table = request.block_table
            slots = [table[p // bs] * bs + p % bs for p in range(first, first + drafted)]
            step.slots_written += slots
            step.slots_rolled_back += slots[accepted:]

    def after_update(self, rolled_back_blocks: list[int]) -> None:
        """The scheduler advanced: every request that was asked for drafts (verified, trimmed
        away by the budget, or not scheduled at all) is what the target says it is now."""
        self.last.blocks_rolled_back = list(rolled_back_blocks)
        for request in self._proposed:
            if not request.status.finished:
                self.proposer.on_verified(request)
        self._proposed = []

    def shutdown(self) -> None:
        shutdown = getattr(self.proposer, "shutdown", None)
        if shutdown is not None:
            shutdown()

    def reset_cache(self) -> None:
        """Forget what finished requests left for drafting (benchmarks start each run cold)."""
        reset = getattr(self.proposer, "reset_cache", None)
        if reset is not None:
            reset()

    def forget(self, request_id: str) -> None:
        self.policy.forget(request_id)
        self.proposer.forget(request_id)

    # ---- observability -------------------------------------------------------------
    def stats(self) -> SpecDecodeStats:
        last = self.last
        pool = self.proposer.pool_stats()
        return SpecDecodeStats(
            method=self.config.method,
            num_speculative_tokens=self.config.num_speculative_tokens,
            disable_by_batch_size=self.config.disable_by_batch_size,
            num_drafts=self.num_drafts,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_accepted_tokens_per_pos=list(self.accepted_per_pos),
            last_step_disabled=last.disabled,
            last_step_draft_tokens=last.draft_tokens,
            last_step_accepted_tokens=last.accepted_tokens,
            slots_written_last_step=list(last.slots_written),
            slots_rolled_back_last_step=list(last.slots_rolled_back),
            blocks_rolled_back_last_step=list(last.blocks_rolled_back),
            draft_policy=self.config.draft_policy,
            last_step_expected_speedup=self.expected_speedup,
            extra_row_cost=self._extra_row_cost(),
            draft_num_blocks=pool[0] if pool else 0,
            draft_block_ref_counts=list(pool[1]) if pool else [],
        )

    def request_stats(self, request_id: str) -> RequestSpecStats:
        state = self.policy.states.get(request_id)
        draft = self.proposer.sequence_stats(request_id)
        stats = RequestSpecStats(draft_block_table=list(draft[0]) if draft else [],
                                 draft_num_computed_tokens=draft[1] if draft else 0)
        if state is not None:
            stats.num_drafts = state.num_drafts
            stats.num_draft_tokens = state.num_draft_tokens
            stats.num_accepted_tokens = state.num_accepted_tokens
            stats.accepted_history = list(state.accepted_history)
            stats.paused = state.paused_steps > 0
            stats.decision = state.decision
        return stats

    def _extra_row_cost(self) -> float:
        """What one more row adds to a one-row step, as the gain policy prices it."""
        one = self.step_cost.cost(1)
        return self.step_cost.cost(2) / one - 1.0 if one > 0 else 0.0

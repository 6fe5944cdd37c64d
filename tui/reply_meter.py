"""Per-request latency from a token stream: TTFT, inter-token latency, decode speed.

Uses the engine's own timestamps (RequestOutput.metrics) when it gives them, so the figures
measure the engine and not the UI's event loop; falls back to the arrival time at the UI.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvdeck.engine.types.outputs import RequestOutput
    from kvdeck.tui.dashboard_state import DashboardState


@dataclass(slots=True)
class ReplyStats:
    ttft_s: float | None
    num_tokens: int
    tokens_per_s: float | None  # decode speed after the first token
    finish_reason: str | None

    def describe(self) -> str:
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {self.ttft_s * 1000:.0f} ms")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        parts.append(f"{self.num_tokens} tokens")
        if self.finish_reason == "abort":
            parts.append("stopped")
        elif self.finish_reason == "length":
            parts.append("max tokens")
        return " · ".join(parts)


@dataclass(slots=True)
class ReplyMeter:
    state: DashboardState | None = None
    ttft_s: float | None = None
    num_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None

    def observe(self, out: RequestOutput) -> None:
        completion = out.outputs[0] if out.outputs else None
        if completion is not None:
            self.finish_reason = completion.finish_reason
        count = len(completion.token_ids) if completion is not None else self.num_tokens
        new_tokens = count - self.num_tokens
        if new_tokens <= 0:
            return
        metrics = out.metrics
        now = metrics.last_token_time if metrics and metrics.last_token_time else time.time()
        if self.first_token_at is None:
            first = metrics.first_token_time if metrics and metrics.first_token_time else now
            self.first_token_at = first
            if metrics is not None and metrics.arrival_time:
                self.ttft_s = max(0.0, first - metrics.arrival_time)
                if self.state is not None:
                    self.state.add_ttft(first, self.ttft_s)
            new_tokens -= 1  # the first token has no inter-token gap
        if new_tokens > 0 and self.last_token_at is not None and now > self.last_token_at:
            if self.state is not None:
                self.state.add_itl(now, (now - self.last_token_at) / new_tokens)
        self.last_token_at = now
        self.num_tokens = count

    def result(self) -> ReplyStats:
        speed = None
        if (self.num_tokens > 1 and self.first_token_at is not None
                and self.last_token_at is not None and self.last_token_at > self.first_token_at):
            speed = (self.num_tokens - 1) / (self.last_token_at - self.first_token_at)
        return ReplyStats(self.ttft_s, self.num_tokens, speed, self.finish_reason)

"""The checks a request must pass before it is queued, written once: the front-end runs
them before anything is sent (so bad input fails at once, with a clear message), and the
core runs them again on what it receives (so no client can hurt it). Each side runs them
once per request: the front-end on the caller's request, the core on each choice."""

from dataclasses import dataclass

from kvdeck.engine.types.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class RequestLimits:
    max_model_len: int
    vocab_size: int

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """ValueError naming the problem, or None."""
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        params.validate()
        if not prompt_token_ids:
            raise ValueError("prompt must not be empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens; max_model_len is "
                f"{self.max_model_len}, which must leave room for at least one generated token"
            )
        vocab = self.vocab_size
        if not (are_token_ids(prompt_token_ids) and 0 <= min(prompt_token_ids)
                and max(prompt_token_ids) < vocab):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if any(t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids must be in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab}), got {max(params.logit_bias)}")


def are_token_ids(values) -> bool:
    """Whether every value is an int and none a bool. Their types are gathered first, at C
    speed: a prompt of plain ints (nearly every one) is not looked at an id at a time."""
    return set(map(type, values)) <= {int} or all(
        isinstance(t, int) and not isinstance(t, bool) for t in values)

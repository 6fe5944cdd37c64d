"""/v1/completions' `echo`: the prompt before the completion, in the text and, with
`logprobs`, in the logprobs (the engine computes the prompt's: SamplingParams.prompt_logprobs).
With `max_tokens: 0` the reply is the prompt alone: how clients such as lm-evaluation-harness
score a text. The engine still generates one token (a request always samples one), which
the reply leaves out, as vLLM does.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvdeck.app.serve.protocol import CompletionRequest
from kvdeck.app.serve.response_parts import echoed_logprobs
from kvdeck.engine.types.outputs import RequestOutput


@dataclass(slots=True, frozen=True)
class Echo:
    prompt_only: bool  # max_tokens 0
    decode: Callable[[list[int]], str]

    @classmethod
    def of(cls, req: CompletionRequest, tokenizer) -> "Echo | None":
        if not req.echo:
            return None
        return cls(req.max_tokens == 0, lambda ids: tokenizer.decode(ids))

    def text(self, out: RequestOutput) -> str:
        """The prompt as given (a token-id prompt: its decoding)."""
        return out.prompt if out.prompt is not None else self.decode(out.prompt_token_ids)

    def logprobs(self, out: RequestOutput, num: int | None) -> dict | None:
        return None if num is None else echoed_logprobs(out, num, self.decode)


def prompt_logprobs_asked(req: CompletionRequest) -> int | None:
    """The prompt logprobs the engine computes: `prompt_logprobs`, or echo's `logprobs`."""
    asked = [n for n in (req.prompt_logprobs, req.logprobs if req.echo else None) if n is not None]
    return max(asked) if asked else None


def without_completion(out: RequestOutput) -> RequestOutput:
    """echo with max_tokens 0: the output with the token generated for it taken out."""
    completion = out.outputs[0]
    emptied = replace(completion, text="", token_ids=[],
                      logprobs=[] if completion.logprobs is not None else None,
                      cumulative_logprob=0.0 if completion.cumulative_logprob is not None else None,
                      finish_reason="length", stop_reason=None)
    return replace(out, outputs=[emptied], delta_text="", delta_token_ids=[])

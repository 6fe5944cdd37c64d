"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, params)`."""

from collections.abc import Sequence
from dataclasses import replace

from kvdeck.engine.api.beam_search import beam_search
from kvdeck.engine.api.llm_engine import LLMEngine
from kvdeck.engine.frontend.parent_request import merge_choices
from kvdeck.engine.types.beam_search import BeamSearchOutput, BeamSearchParams
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.lora import LoRARequest, lora_requests_per_prompt
from kvdeck.engine.types.outputs import EmbeddingOutput, EmbeddingRequestOutput, RequestOutput
from kvdeck.engine.types.prompts import PromptType, batch_prompts
from kvdeck.engine.types.sampling_params import RequestOutputKind, SamplingParams, embedding_params
from kvdeck.engine.types.stats import EngineStats


class LLM:
    """Also a context manager: leaving the `with` block frees the model and the KV pool at
    once (`shutdown()`), instead of whenever the garbage collector gets to them."""

    def __init__(self, model: str | None = None, **config: object) -> None:
        self.engine = LLMEngine(EngineConfig.from_kwargs(model, **config))

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs in prompt order.
        A prompt is a string, a list of token ids, a TextPrompt or a TokensPrompt.
        `lora_request`: the adapter for every prompt, or one (or None: the base) per prompt."""
        prompts = batch_prompts(prompts)
        params = self._params_per_prompt(sampling_params, len(prompts))
        loras = lora_requests_per_prompt(lora_request, len(prompts))
        return self._run([(prompt, None) for prompt in prompts], params, loras)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """Each prompt's embedding, vLLM's `LLM.embed`: the last token's final hidden state,
        L2-normalised (last-token pooling, as decoder embedding models such as Qwen3-Embedding
        and e5-mistral are read). Batched like generate: the prompts are its prefills."""
        outputs = self.generate(prompts, embedding_params(), lora_request)
        return [EmbeddingRequestOutput(out.request_id, out.prompt_token_ids, EmbeddingOutput(out.embedding))
                for out in outputs]

    # ---- LoRA adapters (vLLM's names) ------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter ahead of its first request (checked first: ValueError naming the
        problem); False if the engine holds it already."""
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.engine.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        return self.engine.list_loras()

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """vLLM's beam search (engine/api/beam_search.py): one output per prompt, its
        sequences best first. `concurrency_limit`: the most prompts searched at once."""
        return beam_search(self.engine, self.generate, prompts, params, concurrency_limit)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or several; the chat template is applied
        (`chat_template_kwargs`: more variables for it, as vLLM's: `enable_thinking`)."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        params = self._params_per_prompt(sampling_params, len(conversations))
        return self._run([(None, conversation) for conversation in conversations], params,
                         template_kwargs=chat_template_kwargs)

    @staticmethod
    def _params_per_prompt(params, count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        if len(params) != count:
            raise ValueError(f"got {len(params)} sampling params for {count} prompts")
        return list(params)

    def _run(self, prompts: list[tuple[object, list[dict] | None]], params: list[SamplingParams],
             loras: list[LoRARequest | None] | None = None,
             template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Queue each (prompt, messages) and run them to the end; one output per prompt, its
        choices merged."""
        request_ids: list[str] = []
        # Only the final outputs are kept: the front-end builds no output before those.
        final_only = {id(p): replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params}
        try:
            for i, ((prompt, messages), prompt_params) in enumerate(zip(prompts, params)):
                request_ids.append(self.engine.add_request(None, prompt, final_only[id(prompt_params)],
                                                           messages=messages,
                                                           lora_request=loras[i] if loras else None,
                                                           chat_template_kwargs=template_kwargs))
            finals: dict[str, dict[int, RequestOutput]] = {rid: {} for rid in request_ids}
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    choice = output.outputs[0]
                    if choice.finish_reason is not None:
                        finals[output.request_id][choice.index] = output
        except BaseException:
            # Bad input or an interrupt: leave nothing queued behind.
            self.engine.abort_request(request_ids)
            raise
        return [merge_choices([finals[rid][i] for i in sorted(finals[rid])]) for rid in request_ids]

"""Speculative decoding's part of the EngineCore's start-up: load a draft model before the KV
pool is sized (its weights count against the memory), split the pool between target and
draft, cap max_model_len at what the draft supports, size the decode graphs for verify
chunks, and build the SpeculativeDecoder with its proposer."""

from pathlib import Path

from kvdeck.engine.core.spec.decoder import SpeculativeDecoder
from kvdeck.engine.core.spec.draft_model import DraftModel
from kvdeck.engine.core.spec.draft_proposer import DraftModelProposer
from kvdeck.engine.core.spec.ngram import NgramProposer
from kvdeck.engine.core.spec.proposer import Proposer
from kvdeck.engine.core.spec.suffix import SuffixProposer
from kvdeck.engine.runner.decode_graphs import MAX_CAPTURED_BATCH
from kvdeck.engine.runner.model_runner import ProgressCallback
from kvdeck.engine.runner.step_state import KVCachePlan
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.model_config import ModelConfig


class SpeculativeSetup:
    def __init__(self, config: EngineConfig, model_dir: Path, model_config: ModelConfig,
                 progress: ProgressCallback) -> None:
        self.spec = config.speculative
        self.enforce_eager = config.enforce_eager
        self.progress = progress
        self.draft: DraftModel | None = None
        if self.spec is not None and model_config.long_rope_from is not None:
            # Switching a request to the long factors recomputes its cache; drafts in flight
            # would be verified against the old rotation.
            if self.spec.method == "auto":
                self.spec = None  # "where it pays" includes "where it works"
                progress("loading", "speculation off: LongRoPE models (Phi-3) cannot speculate yet")
            else:
                raise ValueError("speculative decoding does not support LongRoPE models (Phi-3) yet")
        if self.spec is not None and self.spec.method == "draft_model":
            self.draft = DraftModel.load(self.spec, config, model_dir, model_config, progress)

    @property
    def enabled(self) -> bool:
        return self.spec is not None

    def share_kv_plan(self, plan: KVCachePlan) -> KVCachePlan:
        return plan if self.draft is None else self.draft.share_kv_plan(plan)

    def cap_max_model_len(self, max_model_len: int, asked: int | None) -> int:
        """No longer than the draft's positions reach (asking for more is an error)."""
        if self.draft is None or max_model_len <= self.draft.max_model_len:
            return max_model_len
        if asked is not None:
            raise ValueError(f"max_model_len {asked} exceeds the draft model's max_position_embeddings "
                             f"{self.draft.max_model_len} ({self.draft.path})")
        return self.draft.max_model_len

    def max_decode_rows(self, max_num_seqs: int) -> int:
        """Rows of the largest decode-only batch: verify chunks add k rows per speculating request."""
        if self.spec is None:
            return max_num_seqs
        speculating = min(max_num_seqs, self.spec.disable_by_batch_size or max_num_seqs)
        rows = speculating * (1 + self.spec.num_speculative_tokens)
        return max(max_num_seqs, min(rows, MAX_CAPTURED_BATCH))

    def build_decoder(self, plan: KVCachePlan, max_model_len: int,
                      exact_max_rows: int | None = None) -> SpeculativeDecoder | None:
        if self.spec is None:
            return None
        proposer: Proposer
        if self.spec.uses_suffix_trees:
            proposer = SuffixProposer(self.spec)
        elif self.draft is None:
            proposer = NgramProposer(self.spec.prompt_lookup_min, self.spec.prompt_lookup_max)
        else:
            self.draft.allocate(plan.num_blocks)
            runner = self.draft.runner
            if runner.cuda_graphs_supported and not self.enforce_eager:
                # Drafts 2..k are one-token forwards of every speculating request: decode graphs.
                runner.capture_decode_graphs(max_model_len, self.progress)
            proposer = DraftModelProposer(self.draft, plan.num_blocks, plan.block_size)
        return SpeculativeDecoder(self.spec, proposer, max_model_len, plan.block_size, exact_max_rows)

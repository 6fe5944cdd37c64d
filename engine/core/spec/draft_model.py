"""Loading a draft model: the same ModelRunner class as the target, its own config and KV
pool. A draft must share the target's vocabulary (its tokens are the target's tokens); a
mismatch is refused at start-up naming both models and their sizes."""

import dataclasses
import json
import logging
from pathlib import Path

from kvdeck.assets import demo_draft_dir
from kvdeck.engine.core.checkpoint_quantization import with_checkpoint_quantization
from kvdeck.engine.runner.model_runner import ModelRunner, ProgressCallback
from kvdeck.engine.runner.step_state import KVCachePlan
from kvdeck.engine.types.config import EngineConfig
from kvdeck.engine.types.model_config import ModelConfig, read_model_config
from kvdeck.engine.types.model_path import is_demo_model, resolve_model_path
from kvdeck.engine.types.speculative import DEMO_DRAFT, SpeculativeConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class DraftModel:
    path: Path
    model_config: ModelConfig
    runner: ModelRunner

    @classmethod
    def load(cls, spec: SpeculativeConfig, target: EngineConfig, target_dir: Path,
             target_model: ModelConfig, progress: ProgressCallback) -> "DraftModel":
        path = demo_draft_dir() if spec.model == DEMO_DRAFT else resolve_model_path(spec.model)
        model_config = read_model_config(path)
        names = (_draft_name(spec.model), _target_name(target.model))
        check_same_vocabulary(path, model_config, target_dir, target_model, names)
        config = dataclasses.replace(target, model=str(path), tokenizer=None, quantization=spec.quantization,
                                     speculative_config=None)
        config = with_checkpoint_quantization(config, model_config)
        progress("loading", f"loading the draft model from {path}")
        return cls(path, model_config, ModelRunner(config, model_config, path, progress))

    def share_kv_plan(self, plan: KVCachePlan) -> KVCachePlan:
        """The target's share of the KV memory: both pools get the same number of blocks (a
        request needs as many in each), so the memory is split by bytes per block. A fixed
        block count (num_gpu_blocks_override) is given to both as it is."""
        if plan.sized_by == "override":
            return plan
        target, draft = plan.bytes_per_block, self.runner.bytes_per_block
        return dataclasses.replace(plan, num_blocks=plan.num_blocks * target // (target + draft))

    def allocate(self, num_blocks: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_position_embeddings


def check_same_vocabulary(draft_dir: Path, draft: ModelConfig, target_dir: Path, target: ModelConfig,
                          names: tuple[str, str] | None = None) -> None:
    """ValueError unless the draft's vocabulary is the target's: the same size and, where both
    ship a tokenizer.json, the same token for every id. `names`: how the user named the draft
    and the target (default: their folders)."""
    draft_name, target_name = names or (str(draft_dir), str(target_dir))
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"speculative_config.model: the draft {draft_name} does not fit the target "
            f"{target_name}: the draft's vocabulary has {draft.vocab_size} tokens ({draft_dir}) "
            f"and the target's {target.vocab_size} ({target_dir}); a draft model must share "
            "the target's tokenizer")
    mine, theirs = _vocabulary(draft_dir), _vocabulary(target_dir)
    if mine is not None and theirs is not None and mine != theirs:
        differing = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"speculative_config.model: the draft {draft_name} does not fit the target "
            f"{target_name}: the draft's tokenizer ({draft_dir}) maps tokens to other ids than "
            f"the target's ({target_dir}), e.g. {differing}; a draft model must share the "
            "target's tokenizer")


def _draft_name(model: str | None) -> str:
    return f"{model} (the bundled demo model's draft)" if model == DEMO_DRAFT else str(model)


def _target_name(model: str | None) -> str:
    return "the bundled demo model" if is_demo_model(model) else str(model)


def _vocabulary(model_dir: Path) -> dict[str, int] | None:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError):
        return None
    raw = (data.get("model") or {}).get("vocab") or {}
    # BPE/WordPiece: {token: id}; Unigram: [[piece, score], ...] in id order.
    vocab = dict(raw) if isinstance(raw, dict) else {entry[0]: i for i, entry in enumerate(raw)}
    for added in data.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
    return vocab or None

"""A tiny byte-level Llama trained for a few seconds on the calibration text, for the
quantisation-quality tests (until the bundled demo model is used there instead).

A model this small and this briefly trained has none of the activation outliers that
make INT4 hard on real LLMs (round-to-nearest barely changes its perplexity), so
`plant_outlier_channels` gives it some by an exact reparametrisation: a few channels of
each RMSNorm weight (and of up_proj's rows) are multiplied by a factor and the matching
input columns of the linears they feed are divided by it. The fp model computes the same
function; its activations now have the large, rare channels AWQ is designed for.
"""

import hashlib
from pathlib import Path

import torch

TEXT_FILE = Path(__file__).resolve().parents[2] / "assets" / "calibration" / "calibration.txt"
RECIPE = dict(hidden=64, intermediate=192, layers=2, heads=2, steps=100, batch=8, seq=64,
              lr=1e-2, seed=0)


def byte_ids() -> tuple[torch.Tensor, torch.Tensor]:
    """(train ids, held-out ids): the text's bytes, split 90/10."""
    data = torch.tensor(list(TEXT_FILE.read_bytes()), dtype=torch.long)
    cut = int(data.numel() * 0.9)
    return data[:cut], data[cut:]


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=RECIPE["hidden"], intermediate_size=RECIPE["intermediate"],
        num_hidden_layers=RECIPE["layers"], num_attention_heads=RECIPE["heads"],
        num_key_value_heads=RECIPE["heads"], max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def trained_model(cache_dir: Path):
    """Train (or reload from `cache_dir`) the tiny model; returns it in eval mode."""
    key = hashlib.sha256(repr(sorted(RECIPE.items())).encode()).hexdigest()[:12]
    cached = cache_dir / f"tiny-bytes-{key}.pt"
    torch.manual_seed(RECIPE["seed"])
    model = build_model()
    if cached.is_file():
        model.load_state_dict(torch.load(cached, weights_only=True))
        return model.eval()
    train, _ = byte_ids()
    gen = torch.Generator().manual_seed(RECIPE["seed"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=0.0)
    seq = RECIPE["seq"]
    for _ in range(RECIPE["steps"]):
        starts = torch.randint(0, train.numel() - seq, (RECIPE["batch"],), generator=gen)
        batch = torch.stack([train[s:s + seq] for s in starts.tolist()])
        loss = model(batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(cached)
    return model.eval()


@torch.no_grad()
def plant_outlier_channels(model, factor: float = 32.0, channels: int = 4, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        pairs = [
            (layer.input_layernorm.weight, [attn.q_proj, attn.k_proj, attn.v_proj]),
            (layer.post_attention_layernorm.weight, [mlp.gate_proj, mlp.up_proj]),
        ]
        for norm_weight, linears in pairs:
            idx = torch.randperm(norm_weight.numel(), generator=gen)[:channels]
            norm_weight[idx] *= factor
            for linear in linears:
                linear.weight[:, idx] /= factor
        idx = torch.randperm(mlp.up_proj.weight.shape[0], generator=gen)[:channels]
        mlp.up_proj.weight[idx] *= factor
        mlp.down_proj.weight[:, idx] /= factor

"""An AWQ checkpoint (AutoAWQ's GEMM layout) from a tiny dense model, with its reference."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvdeck.quant.packing import pack_awq_weight
from tests.quant.awq_reference import reference_dequantize


def write_awq(dense_dir: Path, out_dir: Path, group: int = 32):
    """Pack every decoder projection of the transformers model in `dense_dir`; returns the
    transformers model with those weights dequantised (the reference)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32).eval()
    out_dir.mkdir()
    tensors, state = {}, {}
    for name, tensor in model.state_dict().items():
        module = name.rpartition(".")[0]
        if ".layers." in name and name.endswith("proj.weight"):
            qweight, qzeros, scales = pack_awq_weight(tensor, group)
            tensors |= {f"{module}.qweight": qweight, f"{module}.qzeros": qzeros,
                        f"{module}.scales": scales}
            state[name] = reference_dequantize(qweight, qzeros, scales, group).t().float()
        elif name != "lm_head.weight" or not model.config.tie_word_embeddings:
            tensors[name] = tensor.contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"))
    config = json.loads((dense_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group,
                                     "zero_point": True, "version": "gemm"}
    (out_dir / "config.json").write_text(json.dumps(config))
    for file in dense_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            (out_dir / file.name).write_bytes(file.read_bytes())
    model.load_state_dict(state, strict=False)
    return model

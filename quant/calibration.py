"""Calibration samples for AWQ: token windows cut from a text file.

The text is tokenised as a whole (documents joined as they are in the file) and cut into
`num_samples` windows of `seq_len` tokens spread evenly over it, as AutoAWQ concatenates
its samples before splitting them into blocks.
"""

from pathlib import Path

import torch

from kvdeck.assets import calibration_text

DEFAULT_CALIBRATION_FILE = calibration_text()


def load_calibration_ids(
    tokenizer, path: str | Path | None = None, num_samples: int = 64, seq_len: int = 512
) -> torch.Tensor:
    """LongTensor [n, seq_len] with n = min(num_samples, windows the text holds)."""
    if num_samples <= 0:
        raise ValueError(f"num_samples must be > 0, got {num_samples}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0, got {seq_len}")
    path = Path(path) if path is not None else DEFAULT_CALIBRATION_FILE
    if not path.is_file():
        raise ValueError(f"calibration file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8", errors="replace")
    # verbose=False: the whole text is longer than the model's context, which is harmless
    # here (it is cut into windows) but makes transformers warn.
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return windows_from_ids(torch.tensor(ids, dtype=torch.long), num_samples, seq_len, path)


def windows_from_ids(
    ids: torch.Tensor, num_samples: int, seq_len: int, source: object = "the text"
) -> torch.Tensor:
    available = ids.numel() // seq_len
    if available == 0:
        raise ValueError(
            f"calibration text {source} has {ids.numel()} tokens, fewer than seq_len={seq_len}"
        )
    count = min(num_samples, available)
    # Evenly spaced windows cover the whole text rather than its beginning only.
    starts = torch.linspace(0, ids.numel() - seq_len, count).long()
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])

"""Apply grammar token bitmasks to logits: a disallowed token's logit becomes -inf.

`bitmask` is int32 [rows, ceil(vocab / 32)], bit t of a row allowing token t (the layout
grammar libraries fill). Torch ops, so it runs on any device.
"""

import torch


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place on `logits` [rows, vocab]; returns it."""
    rows, vocab = logits.shape
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask.to(logits.device).unsqueeze(-1) >> shifts) & 1).bool().view(rows, -1)
    if allowed.shape[1] < vocab:  # tokens past the mask's width are never allowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    return logits.masked_fill_(~allowed[:, :vocab], float("-inf"))

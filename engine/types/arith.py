"""Integer arithmetic the engine repeats (blocks for tokens, pages for bytes)."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative integers, without float rounding."""
    return -(-a // b)

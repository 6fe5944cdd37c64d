"""Loop bounds that every Triton interpreter can take.

`for k in range(lo, hi, STEP)` with runtime bounds (a program id times a kernel argument, a
`tl.minimum`) runs as Python's `range` under TRITON_INTERPRET=1, which asks each bound for
an index. Triton 3.6's interpreter holds every scalar as a one-element array and answers
with `int(array)`, which NumPy 2.4 refuses for arrays of one dimension ("only 0-dimensional
arrays can be converted to Python scalars"); 3.9's squeezes first. `scalar(x)` is that
bound as a Python int under the interpreter, and `x` itself when compiled, where the
function is an empty inline: the loop and its software pipelining are the same as without.
"""

import os

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches the module a jit function sees)

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"  # what triton.jit decided at import


def _as_int(x):
    """A scalar of the interpreter (a tl.tensor over a one-element array) as a Python int."""
    data = getattr(getattr(x, "handle", None), "data", None)
    return x if data is None else int(data.reshape(-1)[0])


if INTERPRETING:
    @triton.jit
    def scalar(x):
        """A runtime scalar as a loop bound (here: a Python int)."""
        return _as_int(x)
else:
    @triton.jit
    def scalar(x):
        """A runtime scalar as a loop bound (compiled: itself)."""
        return x

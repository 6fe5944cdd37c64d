"""Programmatic dependent launch (PDL, Hopper's griddepcontrol) inside kvdeck's kernels.

A decode step is a chain of small kernels (norm, projection, rope, attention, ...), and on a
GPU each boundary costs the next kernel's launch: its programs are scheduled only after the
previous kernel has drained. With PDL a kernel launched with `launch_pdl` may have its
programs resident while the previous one still runs; they wait at `gdc_wait` until it has
completed and its writes are visible. Every kvdeck kernel that takes a `PDL` constexpr
calls `pdl_start(PDL)` before any load or store: so it reads nothing and writes nothing
early, and its completion still implies its predecessor's, as without PDL. Only the W4A16
kernels do something first: they ask L2 for their packed weights, which no kernel writes
(`w4a16_layout.prefetch_words`), so the weights stream in while the previous kernel runs. It then
lets its own dependents launch at once (`gdc_launch_dependents`: they only get resident
once all of this kernel's programs have started, so a kernel of several waves is not
crowded out).

`launch.launch` decides per launch (`launch.pdl_enabled`: KVDECK_PDL=1 on sm_90 or later,
never under the interpreter) and passes both the constexpr and Triton's `launch_pdl`.
"""

import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """Wait for the previous kernel (a no-op when it was not launched with PDL), then let the
    next one launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

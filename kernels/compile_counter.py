"""How many kernel variants this process has compiled: `kernel_compiles()`.

A Triton kernel is compiled once per specialisation: its constexprs and launch options, the
dtype and 16-byte alignment of each tensor, the width of each int and, unless the kernel
names it in do_not_specialize, whether an int is 1 or a multiple of 16. A compile costs
about a second on a GPU, so a batch that crosses such a value mid-serving stalls every
request; the engine warms every variant it will need at start-up, this counter tells when
one was missed (the stats stream, /metrics, `kvdeck bench`). On a GPU it counts Triton's
own compiles (kernels/triton/launch.py installs the hook); under the interpreter, which
compiles nothing, each launch's specialisation key is worked out as Triton would and a key
not seen before counts. No torch, no triton: the engine's stats read it anywhere.
"""

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class KernelCompiles:
    total: int = 0
    by_kernel: Counter = field(default_factory=Counter)
    seen: set = field(default_factory=set)  # interpreter: the specialisation keys launched

    def compiled(self, kernel: str) -> None:
        self.total += 1
        self.by_kernel[kernel] += 1

    def launched(self, kernel: str, key: tuple) -> None:
        """A launch's specialisation key (interpreter): new means compiled."""
        if key not in self.seen:
            self.seen.add(key)
            self.compiled(kernel)


COMPILES = KernelCompiles()


def kernel_compiles() -> int:
    """Kernel variants compiled in this process so far."""
    return COMPILES.total

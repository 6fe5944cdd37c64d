"""What tests count kernel launches with: the interpreter's compile counter
(kvdeck/kernels/compile_counter.py), also listing each launch's kernel by name."""


class LaunchRecorder:
    """Stands in for `launch.COMPILES` (monkeypatched), passing every launch on to it."""

    def __init__(self, counter) -> None:
        self.counter, self.kernels = counter, []

    def launched(self, kernel: str, key: tuple) -> None:
        self.kernels.append(kernel)
        self.counter.launched(kernel, key)

    def lora(self) -> list[str]:
        """The LoRA kernels' launches (per row and grouped)."""
        return [kernel for kernel in self.kernels if "lora" in kernel or "grouped" in kernel]

"""What every W4A16 benchmark shares (bench_w4a16.py's table, w4a16_sweep.py, w4a16_anatomy.py,
w4a16_graph_check.py): random AutoAWQ weights of one shape, made once with their repacked
form and dense reference (`Problem`), and the check a candidate's product must pass."""

import dataclasses

import torch

from kvdeck.kernels.ops import PACK_FACTOR
from kvdeck.kernels.reference.w4a16_gemm import dequantize_awq

GROUP = 128
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # Llama-3-8B's K x N (in x out)


def random_awq(k: int, n: int, device: str, dtype: torch.dtype):
    qweight = torch.randint(-(2**31), 2**31 - 1, (k, n // PACK_FACTOR), dtype=torch.int32,
                            device=device)
    qzeros = torch.randint(-(2**31), 2**31 - 1, (k // GROUP, n // PACK_FACTOR),
                           dtype=torch.int32, device=device)
    scales = (torch.rand(k // GROUP, n, device=device) * 0.002 + 0.0005).to(dtype)
    return qweight, qzeros, scales



@dataclasses.dataclass(slots=True)
class Problem:
    """One weight shape's tensors, made once and shared by its table rows and its sweep."""
    k: int
    n: int
    group: int
    device: str
    dtype: torch.dtype
    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    repacked: object  # RepackedW4
    dense: torch.Tensor

    @classmethod
    def make(cls, k: int, n: int, device: str, dtype: torch.dtype) -> "Problem":
        from kvdeck.kernels.reference.w4a16_repack import repack_awq

        qweight, qzeros, scales = random_awq(k, n, device, dtype)
        return cls(k, n, GROUP, device, dtype, qweight, qzeros, scales,
                   repack_awq(qweight, qzeros, scales, GROUP),
                   dequantize_awq(qweight, qzeros, scales, GROUP).to(dtype))

    def input(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x [m, k] (seeded by m) and the reference product in x's dtype."""
        gen = torch.Generator(device=self.device).manual_seed(m)
        x = torch.randn(m, self.k, device=self.device, dtype=self.dtype, generator=gen)
        return x, (x.float() @ self.dense.float()).to(self.dtype)


def checker(reference_scale: float = 2e-2):
    """check(name, out, reference): raise if a candidate's result is wrong."""
    def check(name: str, out: torch.Tensor, reference: torch.Tensor) -> float:
        error = float((out.float() - reference.float()).abs().max())
        if error > reference_scale * float(reference.abs().max()) + 1e-3:
            raise AssertionError(f"{name} wrong: max error {error}")
        return error
    return check


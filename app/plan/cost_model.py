"""How long one engine step takes, from the batch's shape.

Two models:
- FittedCostModel: least squares of measured step times on the batch's features (a fixed
  cost, rows, decode tokens, prefill tokens, context tokens read, prefill attention pairs),
  non-negative coefficients so it never predicts a negative time. Fitted to a recording's
  own steps or to a run of the real engine; `fit_error` says how well.
- RooflineCostModel: a named GPU and model shape. A step streams its weights and the K/V
  it reads and does its matmul FLOPs; it takes the longer of the two at attainable (not
  peak) rates, plus a fixed host cost:
      max(bytes / (bandwidth * BW_EFFICIENCY), flops / (tflops * FLOPS_EFFICIENCY)) + host
"""

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from kvdeck.app.plan.gpus import GPU
from kvdeck.app.plan.model_shapes import ModelShape

# Decode kernels (GEMV-like, weight streaming) reach 75-85% of DRAM bandwidth on Ampere/Ada/
# Hopper (vLLM, llama.cpp decode figures against the roofline); 0.8.
BW_EFFICIENCY = 0.8
# Large prefill GEMMs reach 50-70% of dense tensor peak in serving engines (MFU figures of
# vLLM/SGLang prefill); 0.6. INT4 GEMMs dequantise in the loop: Marlin-class kernels come near
# 16-bit speed at decode sizes and lose about a quarter on prefill-sized ones; 0.45.
FLOPS_EFFICIENCY = {"bf16": 0.6, "fp16": 0.6, "int8": 0.5, "awq": 0.45, "gptq": 0.45}
# Per step on the host: scheduling, input preparation, sampling, launching (a CUDA-graph
# decode); kvdeck's own profile of a GPU step is a few milliseconds, with async scheduling
# hiding part of it. 2 ms plus 20 us a row.
HOST_FIXED_S = 0.002
HOST_PER_ROW_S = 20e-6

FEATURES = ("fixed", "rows", "decode_tokens", "prefill_tokens", "context_tokens",
            "attention_pairs")


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step's batch asks of the device."""

    num_seqs: int
    decode_tokens: int
    prefill_tokens: int
    context_tokens: int  # K/V tokens attention reads: each row's computed + new tokens
    # (query, key) pairs attention computes: a row of n new tokens after c -> n * (c + (n+1)/2)
    attention_pairs: int = 0

    def features(self) -> list[float]:
        return [1.0, self.num_seqs, self.decode_tokens, self.prefill_tokens, self.context_tokens,
                self.attention_pairs]


# Swap preemption's copies between device and host: PCIe 4.0 x16 attains about 25 GB/s of
# its 32; on a CPU engine it is a memcpy in host memory, faster still (not the bottleneck).
COPY_GB_S = 25.0


class CostModel(ABC):
    """A step's duration from its shape: fitted to measured steps, or a GPU's roofline."""

    description: str = ""
    copy_gb_s: float = COPY_GB_S

    @abstractmethod
    def step_seconds(self, shape: StepShape) -> float: ...

    def copy_seconds(self, nbytes: int) -> float:
        return nbytes / (self.copy_gb_s * 1e9)


@dataclass(slots=True)
class StepSample:
    shape: StepShape
    seconds: float


@dataclass(slots=True)
class FittedCostModel(CostModel):
    coefficients: list[float]  # per FEATURES: steps with prefill tokens (or every step)
    fit_error: float = 0.0  # median |relative error| over the fitted steps
    fit_rms_s: float = 0.0
    num_samples: int = 0
    description: str = field(default="")
    # Decode-only steps, fitted apart where there are enough of both kinds: they take other
    # paths (decode graphs, the CPU's native decoder stack) and are most steps, so one line
    # through both kinds would tilt towards them. None: `coefficients` serve every step.
    decode_coefficients: list[float] | None = None

    def step_seconds(self, shape: StepShape) -> float:
        coefficients = self.coefficients
        if shape.prefill_tokens == 0 and self.decode_coefficients is not None:
            coefficients = self.decode_coefficients
        return max(0.0, sum(c * x for c, x in zip(coefficients, shape.features())))

    @classmethod
    def fit(cls, samples: list[StepSample], source: str) -> "FittedCostModel":
        """Non-negative least squares (dropping a feature whose coefficient comes out negative,
        then refitting), on steps weighted equally in relative terms, refit once without the
        outliers; decode-only steps and the rest apart when each kind has enough steps."""
        if len(samples) < len(FEATURES):
            raise ValueError(f"{source}: {len(samples)} step records are too few to fit a step-"
                             f"cost model (need {len(FEATURES)}); record a longer session")
        x = np.array([s.shape.features() for s in samples], dtype=np.float64)
        y = np.array([s.seconds for s in samples], dtype=np.float64)
        decode = x[:, 3] == 0  # no prefill tokens
        split = decode.sum() >= len(FEATURES) and (~decode).sum() >= len(FEATURES)
        coef = _robust_fit(x[~decode], y[~decode]) if split else _robust_fit(x, y)
        decode_coef = _robust_fit(x[decode], y[decode]) if split else None
        model = cls(coef.tolist(), decode_coefficients=decode_coef.tolist() if split else None)
        predicted = np.array([model.step_seconds(s.shape) for s in samples])
        rel = np.abs(predicted - y) / np.maximum(y, 1e-9)
        model.fit_error = float(np.median(rel))
        model.fit_rms_s = float(math.sqrt(np.mean((predicted - y) ** 2)))
        model.num_samples = len(samples)
        terms = _terms(coef)
        if split:
            terms = f"prefill steps: {terms}; decode steps: {_terms(decode_coef)}"
        model.description = (f"fitted to {len(samples)} steps of {source} ({terms}); median error "
                             f"{model.fit_error:.1%}")
        return model

    def with_host_overhead(self, seconds: float, why: str) -> "FittedCostModel":
        """The same model plus a fixed cost per step the fitted times did not include."""
        coefficients = [self.coefficients[0] + seconds, *self.coefficients[1:]]
        decode = self.decode_coefficients
        if decode is not None:
            decode = [decode[0] + seconds, *decode[1:]]
        return FittedCostModel(coefficients, self.fit_error, self.fit_rms_s, self.num_samples,
                               f"{self.description}; + {seconds * 1e3:.3g} ms a step {why}", decode)


def _terms(coef: np.ndarray) -> str:
    return ", ".join(f"{name} {c * 1e3:.4g} ms" for name, c in zip(FEATURES, coef) if c > 0)


def _robust_fit(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    coef = _nnls(x, y, relative)
    # Once more without the outliers (a first step's warm-up, a step the OS descheduled).
    rel = np.abs(np.maximum(x @ coef, 0.0) - y) / np.maximum(y, 1e-9)
    keep = rel <= max(5 * float(np.median(rel)), 0.05)
    if keep.sum() >= len(FEATURES) and not keep.all():
        coef = _nnls(x[keep], y[keep], relative)
    return coef


def _nnls(x: np.ndarray, y: np.ndarray, relative: bool = True) -> np.ndarray:
    """Least squares with non-negative coefficients: a feature whose coefficient comes out
    negative is dropped (the most negative first) and the rest refit. `relative`: weighted by
    1/time, so that short steps count as much as long ones."""
    w = 1.0 / np.maximum(y, 1e-6) if relative else np.ones_like(y)
    # Features that never vary are the fixed cost's (or absent): left out.
    active = [i for i in range(x.shape[1]) if i == 0 or np.ptp(x[:, i]) > 0]
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # the most negative goes; refit the rest
    return coef


@dataclass(slots=True)
class RooflineCostModel(CostModel):
    gpu: GPU
    shape: ModelShape
    quant: str
    kv_dtype: str
    bw_efficiency: float = BW_EFFICIENCY
    flops_efficiency: float = 0.0  # 0: FLOPS_EFFICIENCY[quant]
    host_fixed_s: float = HOST_FIXED_S
    host_per_row_s: float = HOST_PER_ROW_S
    description: str = ""

    def __post_init__(self) -> None:
        if not self.flops_efficiency:
            self.flops_efficiency = FLOPS_EFFICIENCY[self.quant]
        self._weight_bytes = self.shape.weight_bytes_per_step(self.quant)
        self._kv_token = self.shape.kv_bytes_per_token(self.kv_dtype)
        self._bandwidth = self.gpu.bandwidth_gb_s * 1e9 * self.bw_efficiency
        self._flops = self.gpu.bf16_tflops * 1e12 * self.flops_efficiency
        self.description = (
            f"roofline of {self.gpu.name} ({self.gpu.bandwidth_gb_s:g} GB/s x {self.bw_efficiency:g}, "
            f"{self.gpu.bf16_tflops:g} TFLOPS x {self.flops_efficiency:g}) for {self.shape.name} "
            f"{self.quant}, KV {self.kv_dtype}; host {self.host_fixed_s * 1e3:g} ms + "
            f"{self.host_per_row_s * 1e6:g} us/row")

    _weight_bytes: int = 0
    _kv_token: int = 0
    _bandwidth: float = 0.0
    _flops: float = 0.0

    def step_seconds(self, shape: StepShape) -> float:
        new_tokens = shape.decode_tokens + shape.prefill_tokens
        moved = self._weight_bytes + (shape.context_tokens + new_tokens) * self._kv_token
        flops = self.shape.flops_per_token() * new_tokens + self.shape.attention_flops(shape.attention_pairs)
        device = max(moved / self._bandwidth, flops / self._flops)
        return device + self.host_fixed_s + self.host_per_row_s * shape.num_seqs

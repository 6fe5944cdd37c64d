"""Per-architecture LoRA kernel configs, from a committed GPU sweep.

Written by `python benchmarks/lora_tune.py SWEEP_JSON` (the sweep: bench_lora_kernels.py, run
by `benchmarks/run_gpu.sh lora`); edit the sweep, not this file. Read by lora_plan.py: SM
version -> plain data
  config: LoRAKernelConfig fields   the candidate whose decode layer cost least
  source: the sweep JSON and the device it ran on
An architecture missing here runs lora_plan.py's defaults.
"""

TUNED: dict[int, dict] = {}

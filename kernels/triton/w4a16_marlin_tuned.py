"""Per-architecture configs of the repacked W4A16 kernel, from a committed GPU sweep.

Written by `python benchmarks/w4a16_tune.py SWEEP_JSON` (the sweep: bench_w4a16.py
--marlin-sweep, run by `benchmarks/run_gpu.sh w4a16`); edit the sweep, not this file. Read
by kernels/triton/w4a16_marlin_plan.py: SM version -> plain data
  buckets: ((M bucket limit, MarlinConfig fields), ...)   the buckets the sweep measured
  programs_per_sm: the wave model's programs per SM that best predicted the fastest split
  fused_max_tokens: the largest M the fused kernel serves (above: dequantise + cuBLAS)
  source: the sweep JSON and the device it ran on
An architecture missing here runs the defaults of w4a16_marlin_plan.py.
"""

TUNED: dict[int, dict] = {90: {'buckets': ((16,
                   {'block_k': 128,
                    'block_m': 16,
                    'block_n': 64,
                    'num_stages': 4,
                    'num_warps': 4,
                    'split_k': 16}),
                  (32,
                   {'block_k': 128,
                    'block_m': 32,
                    'block_n': 64,
                    'num_stages': 4,
                    'num_warps': 4,
                    'split_k': 8}),
                  (64,
                   {'block_k': 128,
                    'block_m': 64,
                    'block_n': 128,
                    'num_stages': 3,
                    'num_warps': 8,
                    'split_k': 4}),
                  (256,
                   {'block_k': 64,
                    'block_m': 128,
                    'block_n': 128,
                    'num_stages': 3,
                    'num_warps': 8,
                    'split_k': 2})),
      'fused_max_tokens': 64,
      'programs_per_sm': 2,
      'source': 'w4a16_h200.json (NVIDIA H200, commit unknown)'}}

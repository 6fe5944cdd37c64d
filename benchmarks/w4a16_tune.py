"""The W4A16 bench's JSON -> which kernel wins per M bucket, and the per-architecture config
table of the repacked kernel (kernels/triton/w4a16_marlin_tuned.py).

    python benchmarks/w4a16_tune.py benchmarks/results/w4a16_h100.json            # write the table
                                                                                  # and W4A16_AUTO
    python benchmarks/w4a16_tune.py benchmarks/results/w4a16_h100.json --dry-run  # print only

The JSON is bench_w4a16.py's with --marlin-sweep (what `benchmarks/run_gpu.sh w4a16` runs);
commit it beside the table this writes. Every choice is a geometric mean over the weight
shapes of speed-ups against bf16 cuBLAS timed in the same rounds:
  decode bucket (M <= 16)  the sweep's best `config` row
  programs_per_sm          the wave model's value whose `choose_split` picks cost least
                           (measured time of its pick over the fastest measured split)
  buckets 32, 64 and 256   the sweep's best fused config at M = 32, 64 and 256
  fused_max_tokens         the largest bucket limit up to which the fused kernel beats
                           dequantise + cuBLAS at every measured M
  gemv, gemv_max_tokens    the sweep's best `gemv` row (M = 1), served to batch 1 (1) when
                           it beats the decode bucket's pick timed in the same rounds, else 0
Candidates the sweep could not run (its `error` rows) are left out; a config counts only
where it ran at every shape.
The summary also names, per M of the table, the fastest of marlin (under the sweep's pick,
where the JSON timed it: `marlin_tuned`) / triton (the AWQ layout) / dequantise + cuBLAS, and
sets W4A16_AUTO (kernels/w4a16_choice.py) to the faster of marlin and triton at decode sizes. `targets`
judges the W4A16 targets on a set of rows (the table's, or bench_w4a16's `marlin_tuned`,
timed under the sweep's pick) and e2e.
"""

import argparse
import json
import math
import pprint
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_kernels import summary_line  # noqa: E402
from tuned_table import read_tuned, write_tuned  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "kernels" / "triton" / "w4a16_marlin_tuned.py"
CHOICE = REPO / "kernels" / "w4a16_choice.py"  # W4A16_AUTO: what KVDECK_W4A16_KERNEL=auto runs
# The table's candidates: name -> the row's *_ms keys, the fastest of which stands for it.
TABLE_KERNELS = {"marlin": ("marlin_ms",), "triton": ("triton_ms",),
                 "dequant+cublas": ("marlin_dequant_ms", "dequant_ms")}
DECODE_M = 64  # W4A16_AUTO is chosen on the table's M up to this (decode batches)
# The W4A16 targets (CUDA-graph timing, an H100 or H200): (what, which rows, least speed-up of `marlin` over
# bf16 cuBLAS), and AWQ's batch-1 decode on the marlin kernel over its bf16 self.
GEMM_TARGETS = (
    ("M <= 16 on 4096x14336 and 14336x4096",
     lambda row: row["m"] <= 16 and 14336 in (row["k"], row["n"]), 2.5),
    ("M <= 16 on 4096x4096", lambda row: row["m"] <= 16 and row["k"] == row["n"] == 4096, 1.8),
    ("every M up to 512", lambda row: row["m"] <= 512, 1.0),
)
E2E_TARGET = 2.0


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarise_table(rows: list[dict], tuned_rows: list[dict] | None = None) -> dict:
    """Per M: each kernel's geomean speed-up over bf16 and the winner; the auto kernel.
    `tuned_rows` (bench_w4a16's `marlin_tuned`): marlin's figures under the sweep's pick,
    which the tuned table will serve, in place of the table's (each against its own bf16)."""
    by_m: dict[int, dict] = {}
    for m in sorted({row["m"] for row in rows if "bf16_ms" in row}):
        speedups = {}
        tuned = [row["marlin_speedup_vs_bf16"] for row in tuned_rows or () if row["m"] == m]
        for kernel, keys in TABLE_KERNELS.items():
            values = tuned if kernel == "marlin" and tuned else [
                row["bf16_ms"] / min(row[key] for key in keys if key in row)
                for row in rows if row["m"] == m and "bf16_ms" in row and any(key in row for key in keys)]
            if values:
                speedups[kernel] = round(_geomean(values), 4)
        by_m[m] = {"speedup_vs_bf16": speedups, "winner": max(speedups, key=speedups.get)}
    decode = {kernel: _geomean([entry["speedup_vs_bf16"][kernel] for m, entry in by_m.items()
                                if m <= DECODE_M and kernel in entry["speedup_vs_bf16"]])
              for kernel in ("marlin", "triton")}
    # KVDECK_W4A16_KERNEL's names: the table's `triton` is the AWQ-layout kernel, `awq` there.
    auto = {"marlin": "marlin", "triton": "awq"}[max(decode, key=decode.get)] if by_m else None
    # The gate | up rows (bench_w4a16.py's `_gated_candidates`): one launch against two.
    gated = {str(row["m"]): round(row["marlin_act_ms"] / row["marlin_gated_ms"], 4)
             for row in rows if "marlin_gated_ms" in row}
    return {"winners_by_m": {str(m): entry for m, entry in by_m.items()},
            "w4a16_auto": auto, "decode_speedup_vs_bf16": {k: round(v, 4) for k, v in decode.items()},
            **({"gated_speedup_vs_unfused": gated} if gated else {})}


def _best_config(rows: list[dict]) -> tuple[list, float] | None:
    """(values, geomean speed-up over bf16) of the config measured at every (m, shape)."""
    groups = {(row["m"], row["k"], row["n"]) for row in rows}
    by_values: dict[tuple, list[float]] = {}
    for row in rows:
        by_values.setdefault(tuple(row["values"]), []).append(row["bf16_ms"] / row["ms"])
    complete = {values: _geomean(s) for values, s in by_values.items() if len(s) == len(groups)}
    if not complete:
        return None
    best = max(complete, key=complete.get)
    return list(best), complete[best]


def _programs_per_sm(split_rows: list[dict]) -> tuple[int, dict] | None:
    """The wave model's programs per SM whose split picks lose least against the fastest split."""
    from kvdeck.kernels.triton.w4a16_marlin_plan import choose_split

    groups: dict[tuple, list[dict]] = {}
    for row in split_rows:
        groups.setdefault((row["m"], row["k"], row["n"]), []).append(row)
    if not groups:
        return None
    losses = {}
    for programs in (int(p) for p in split_rows[0]["wave_efficiency"]):
        ratios = []
        for group in groups.values():
            measured = {row["split"]: row["ms"] for row in group}
            first = group[0]
            pick = choose_split(first["tiles"], first["k_tiles"], max(measured), programs * first["num_sms"])
            ratios.append(measured.get(pick, max(measured.values())) / min(measured.values()))
        losses[programs] = _geomean(ratios)
    best = min(losses, key=lambda p: (losses[p], p))
    return best, {str(p): round(loss, 4) for p, loss in losses.items()}


def summarise_sweep(sweep_rows: list[dict], table_rows: list[dict]) -> dict:
    """The tuned entry the sweep supports, and what each choice rests on."""
    out: dict = {}
    small = _best_config([r for r in sweep_rows if r["kind"] == "config"])
    buckets = []
    if small:
        buckets.append([16, small[0]])
        out["bucket16_speedup_vs_bf16"] = round(small[1], 4)
    for limit in (32, 64, 256):
        fused = [r for r in sweep_rows if r["kind"] == "large" and r["path"] == "fused"
                 and r.get("bucket") == limit and r["m"] == limit]
        best = _best_config(fused)
        if best:
            buckets.append([limit, best[0]])
            out[f"bucket{limit}_speedup_vs_bf16"] = round(best[1], 4)
    gemv = _best_config([r for r in sweep_rows if r["kind"] == "gemv"])
    if gemv:
        out["gemv"], out["gemv_speedup_vs_bf16"] = gemv[0], round(gemv[1], 4)
        gemv_m = {r["m"] for r in sweep_rows if r["kind"] == "gemv"}
        fused = [r["bf16_ms"] / r["ms"] for r in sweep_rows
                 if r["kind"] == "config" and r["m"] in gemv_m and small and r["values"] == small[0]]
        out["bucket16_at_gemv_m_speedup_vs_bf16"] = round(_geomean(fused), 4) if fused else None
        out["gemv_max_tokens"] = max(gemv_m) if fused and gemv[1] > _geomean(fused) else 0
    picked = _programs_per_sm([r for r in sweep_rows if r["kind"] == "split"])
    if picked:
        out["programs_per_sm"], out["split_pick_loss"] = picked
    # Fused (best config per M) against dequantise + cuBLAS, at every M measured.
    fused_wins = {}
    for m in sorted({r["m"] for r in sweep_rows if r["kind"] == "large"}):
        at_m = [r for r in sweep_rows if r["kind"] == "large" and r["m"] == m]
        dequant = [r["bf16_ms"] / r["ms"] for r in at_m if r["path"] == "dequant"]
        best = _best_config([r for r in at_m if r["path"] == "fused"])
        fused_wins[m] = best is not None and (not dequant or best[1] > _geomean(dequant))
    for row in table_rows:  # the table's small M: fused marlin against its dequantise path
        if row["m"] <= 16 and "marlin_ms" in row and "marlin_dequant_ms" in row:
            won = row["marlin_ms"] < row["marlin_dequant_ms"]
            fused_wins[row["m"]] = fused_wins.get(row["m"], True) and won
    fused_max = 0
    for limit in (16, 32, 64, 256):
        if fused_wins and all(won for m, won in fused_wins.items() if m <= limit):
            fused_max = limit
        else:
            break
    out["fused_wins_by_m"] = {str(m): won for m, won in sorted(fused_wins.items())}
    out["fused_max_tokens"] = fused_max
    out["buckets"] = buckets
    return {"tuned": out}


def targets(rows: list[dict], e2e: list[dict]) -> dict:
    """Each W4A16 target: the worst measured figure, how many rows measured it, and
    whether it holds (None: nothing here measured it, as a CPU smoke run's shapes)."""
    out = {}
    for what, selects, bar in GEMM_TARGETS:
        speedups = [row["marlin_speedup_vs_bf16"] for row in rows
                    if "marlin_speedup_vs_bf16" in row and selects(row)]
        worst = min(speedups) if speedups else None
        out[f"gemm {what} >= {bar}x bf16"] = {
            "worst": None if worst is None else float(f"{worst:.4g}"), "rows": len(speedups),
            "met": None if worst is None else worst >= bar}
    batch1 = {entry["variant"]: run["output_tokens_per_s"] for entry in e2e
              for run in entry.get("runs", ()) if run["batch"] == 1}
    # Plain launches, then both engines with programmatic dependent launch (w4a16_e2e.py's
    # `_pdl` variants: what the engine serves if KVDECK_PDL goes on by default).
    for suffix, label in (("", ""), ("_pdl", " (both with PDL)")):
        awq, bf16 = f"awq_marlin{suffix}", f"bf16{suffix}"
        ratio = batch1[awq] / batch1[bf16] if {awq, bf16} <= set(batch1) else None
        out[f"e2e batch-1 decode awq_marlin >= {E2E_TARGET}x bf16{label}"] = {
            "ratio": None if ratio is None else float(f"{ratio:.4g}"),
            "met": None if ratio is None else ratio >= E2E_TARGET}
    return out


def pdl_effect(e2e: list[dict]) -> dict:
    """Each `_pdl` e2e engine against its plain twin: tokens/s ratio per batch size, and
    whether their greedy tokens agree (the same kernels and dummy weights: they must, bit for
    bit, unless a kernel read before its predecessor finished)."""
    return twin_effect(e2e, "_pdl")


def twin_effect(e2e: list[dict], suffix: str) -> dict:
    """Each e2e engine named `<plain><suffix>` against its plain twin, as `pdl_effect` says."""
    by_variant = {entry["variant"]: entry for entry in e2e}
    effect = {}
    for variant, entry in by_variant.items():
        plain = by_variant.get(variant.removesuffix(suffix)) if variant.endswith(suffix) else None
        if plain is None:
            continue
        if "error" in entry:  # the twin did not run (under PDL, say): say so
            effect[variant] = {"error": entry["error"][-300:]}
            continue
        plain_runs = {run["batch"]: run for run in plain["runs"]}
        figures: dict = {}
        for run in entry["runs"]:
            if run["batch"] in plain_runs:
                twin = plain_runs[run["batch"]]
                figures[f"batch_{run['batch']}_speedup"] = float(
                    f"{run['output_tokens_per_s'] / twin['output_tokens_per_s']:.4g}")
                if "tokens" in run and "tokens" in twin:
                    figures[f"batch_{run['batch']}_tokens_equal"] = run["tokens"] == twin["tokens"]
        effect[variant] = figures
    return effect


PDL_GAIN = 1.02  # batch-1 speed-up a PDL twin must show, over the timing's noise, to count


def pdl_verdict(effect: dict) -> str:
    """Whether the e2e PDL twins say to make KVDECK_PDL=1 the default (launch.pdl_setting):
    both measured, every greedy token equal to its twin's, each at least PDL_GAIN faster at
    batch 1."""
    wanted = ("awq_marlin_pdl", "bf16_pdl")
    if not all(name in effect and "error" not in effect[name] for name in wanted):
        return "PDL: keep off (a PDL engine did not run: " + ", ".join(
            f"{name}: {effect.get(name, {}).get('error', 'not measured')[:120]}" for name in wanted
            if name not in effect or "error" in effect[name]) + ")"
    unequal = [name for name in wanted
               if not all(equal for key, equal in effect[name].items() if key.endswith("tokens_equal"))]
    if unequal:
        return f"PDL: keep off and find why: {', '.join(unequal)} gave other tokens than its twin"
    gains = {name: effect[name].get("batch_1_speedup", 0.0) for name in wanted}
    shown = ", ".join(f"{name} {gain:.3f}x" for name, gain in gains.items())
    if all(gain >= PDL_GAIN for gain in gains.values()):
        return f"PDL: make KVDECK_PDL=1 the default ({shown}, tokens equal)"
    return f"PDL: keep off ({shown}; the default wants each >= {PDL_GAIN}x)"


def fused_activation_verdict(effect: dict) -> str:
    """Whether the e2e twin without the fused activation (w4a16_e2e.py's `awq_marlin_unfused`,
    KVDECK_FUSED_ACTIVATION=0) says to keep the activation in the GEMM's epilogue (the
    default): its greedy tokens must equal the fused engine's, and it must not be faster by
    more than the timing's noise."""
    figures = effect.get("awq_marlin_unfused")
    if figures is None or "error" in figures:
        return "fused activation: not measured" + (f" ({figures['error'][:120]})" if figures else "")
    if not all(equal for key, equal in figures.items() if key.endswith("tokens_equal")):
        return ("fused activation: turn off (KVDECK_FUSED_ACTIVATION=0) and find why: other tokens "
                "than unfused")
    unfused = figures.get("batch_1_speedup", 1.0)
    if unfused >= PDL_GAIN:
        return f"fused activation: turn off, the unfused engine is {unfused:.3f}x at batch 1"
    return f"fused activation: keep on (the unfused engine {unfused:.3f}x at batch 1, tokens equal)"


def entry_from_sweep(tuned: dict, source: str) -> dict:
    """The TUNED entry `summarise_sweep(...)["tuned"]` supports, checked as the kernel reads it."""
    from kvdeck.kernels.triton.w4a16_marlin_plan import CONFIG_FIELDS, tuning_from_table

    entry = {
        "source": source,
        "programs_per_sm": tuned.get("programs_per_sm", 2),
        "fused_max_tokens": tuned["fused_max_tokens"],
        "buckets": tuple((limit, dict(zip(CONFIG_FIELDS, values))) for limit, values in tuned["buckets"]),
    }
    if tuned.get("gemv"):
        entry["gemv_max_tokens"] = tuned.get("gemv_max_tokens", 0)
        entry["gemv"] = dict(zip(CONFIG_FIELDS, tuned["gemv"]))
    tuning_from_table(entry)  # the kernel's own check of what it will read
    return entry


def tuned_entry(result: dict, source: str) -> tuple[int, dict]:
    """(SM version, the TUNED entry) from a bench JSON with its sweep."""
    if not result.get("marlin_sweep"):
        raise ValueError("the JSON has no marlin_sweep (run bench_w4a16.py --marlin-sweep)")
    if result.get("sm") is None:
        raise ValueError("the JSON names no SM version (a CPU smoke run): nothing to tune")
    tuned = summarise_sweep(result["marlin_sweep"], result.get("results", []))["tuned"]
    source = f"{source} ({result.get('device')}, commit {str(result.get('commit'))[:12]})"
    return int(result["sm"]), entry_from_sweep(tuned, source)


def write_auto(kernel: str, path: Path = CHOICE) -> bool:
    """Set `W4A16_AUTO = "<kernel>"` in kernels/w4a16_choice.py; whether the line changed."""
    text = path.read_text()
    line = re.search(r'^W4A16_AUTO = "(\w+)"$', text, flags=re.MULTILINE)
    if line is None:
        raise ValueError(f"{path} has no W4A16_AUTO line to set")
    if line.group(1) == kernel:
        return False
    path.write_text(text[:line.start()] + f'W4A16_AUTO = "{kernel}"' + text[line.end():])
    return True


def report(summary: dict) -> list[str]:
    lines = []
    for m, entry in summary.get("winners_by_m", {}).items():
        figures = "  ".join(f"{k} {v:.2f}x" for k, v in entry["speedup_vs_bf16"].items())
        lines.append(f"M={m:>4}: {figures}  -> {entry['winner']}")
    if summary.get("w4a16_auto"):
        lines.append(f"W4A16_AUTO: {summary['w4a16_auto']} (decode M <= {DECODE_M}: "
                     f"{summary['decode_speedup_vs_bf16']})")
    if "tuned" in summary:
        lines.append(f"tuned: {json.dumps(summary['tuned'])}")
    for variant, figures in summary.get("e2e_pdl", {}).items():
        lines.append(f"pdl {variant} over its plain twin: {json.dumps(figures)}")
    if summary.get("e2e_pdl"):
        lines.append(pdl_verdict(summary["e2e_pdl"]))
    for variant, figures in summary.get("e2e_fused_activation", {}).items():
        lines.append(f"{variant} over the fused engine: {json.dumps(figures)}")
    if summary.get("e2e_fused_activation"):
        lines.append(fused_activation_verdict(summary["e2e_fused_activation"]))
    gated = summary.get("gated_speedup_vs_unfused", {})
    if gated:
        lines.append("gated GEMM (activation in the epilogue) over GEMM + activation kernel: "
                     + "  ".join(f"M={m} {value:.3f}x" for m, value in gated.items()))
    for key, label in (("targets", "defaults"), ("targets_tuned", "the sweep's pick")):
        for target, figures in summary.get(key, {}).items():
            verdict = {True: "met", False: "MISSED", None: "not measured"}[figures["met"]]
            shown = {name: value for name, value in figures.items() if name != "met"}
            lines.append(f"target ({label}) {target}: {verdict} {json.dumps(shown)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="bench_w4a16.py JSON with marlin_sweep")
    parser.add_argument("--table", type=Path, default=TABLE, help="the module to (re)write")
    parser.add_argument("--choice", type=Path, default=CHOICE, help="the module whose W4A16_AUTO to set")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    result = json.loads(args.result.read_text())
    e2e = result.get("e2e_decode", [])
    summary = {**summarise_table(result.get("results", []), result.get("marlin_tuned")),
               **summarise_sweep(result.get("marlin_sweep", []), result.get("results", [])),
               "targets": targets(result.get("results", []), e2e), "e2e_pdl": pdl_effect(e2e),
               "e2e_fused_activation": twin_effect(e2e, "_unfused")}
    if result.get("marlin_tuned"):
        summary["targets_tuned"] = targets(result["marlin_tuned"], e2e)
    for line in report(summary):
        print(line)
    for entry in e2e:  # where each engine's batch-1 step went (w4a16_e2e.py's profile)
        for run in entry["runs"]:
            if "kernels" in run:
                print(f"e2e {entry['variant']} batch {run['batch']} profiled: {summary_line(run['kernels'])}")
    arch, entry = tuned_entry(result, args.result.name)
    table = {**read_tuned(args.table), arch: entry}
    print(f"sm_{arch}: {pprint.pformat(entry, width=100)}")
    if not args.dry_run:
        write_tuned(table, args.table)
        print(f"wrote {args.table}; the AOT matrix compiles its tiles for sm_{arch} (no spill, "
              "shared memory that fits): python -m pytest tests/kernels/test_compile_for_gpu.py")
        if summary.get("w4a16_auto"):
            changed = write_auto(summary["w4a16_auto"], args.choice)
            print(f"{'set' if changed else 'kept'} W4A16_AUTO = {summary['w4a16_auto']!r} in {args.choice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

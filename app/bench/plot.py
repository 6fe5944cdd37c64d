"""PNG figures for benchmark results (matplotlib, drawn off-screen)."""

from pathlib import Path


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        # The JSON is already written; a machine without matplotlib (the lent GPU image)
        # gets a clear message instead of a failed stage.
        raise PlotUnavailable(
            "matplotlib is not installed; no plot drawn (the JSON has the figures)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(result: dict, path: str) -> None:
    plt = _pyplot()
    names = ["kvdeck"] + (["baseline"] if "baseline" in result else [])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].bar(names, [result[n]["output_tokens_per_s"] for n in names], color=["#4c9be8", "#aaaaaa"])
    axes[0].set_ylabel("output tokens/s")
    title = "throughput"
    if "ratio" in result:
        title += f" (ratio {result['ratio']:.2f}x)"
    axes[0].set_title(title)
    kv = result["kvdeck"]
    axes[1].bar(["paged (kvdeck)", "contiguous max-len"],
                [kv["kv_waste_at_peak"] * 100, kv["contiguous_kv_waste_at_peak"] * 100],
                color=["#4c9be8", "#e8a04c"])
    axes[1].set_ylabel("KV slots wasted at peak (%)")
    axes[1].set_title("KV waste")
    fig.suptitle(f"{result['environment']['device']} · {result['config']['model']}")
    _save(fig, path, plt)


def plot_serving(result: dict, per_request: list[dict], timeline: list[tuple[float, int]], path: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ttft = [r["ttft_s"] * 1000 for r in per_request if r.get("ttft_s") is not None]
    itl = [x * 1000 for r in per_request for x in r.get("itl_s", [])]
    axes[0].hist(ttft, bins=30, color="#4c9be8")
    axes[0].set_xlabel("TTFT (ms)")
    axes[1].hist(itl, bins=30, color="#e8a04c")
    axes[1].set_xlabel("ITL (ms)")
    if timeline:
        t0 = timeline[0][0]
        seconds = [int(t - t0) for t, _ in timeline]
        per_second: dict[int, int] = {}
        for s, (_, n) in zip(seconds, timeline):
            per_second[s] = per_second.get(s, 0) + n
        xs = sorted(per_second)
        axes[2].plot(xs, [per_second[x] for x in xs], color="#4caf50")
    axes[2].set_xlabel("time (s)")
    axes[2].set_ylabel("output tokens/s")
    _save(fig, path, plt)


def _save(fig, path: str, plt) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(target)

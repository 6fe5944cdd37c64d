"""What one attached dashboard costs a server: saturating throughput of `kvdeck --serve`
with nobody watching against the same load while a `kvdeck attach` client reads the stats
stream (the real client: it asks for the same snapshots the TUI draws). Rounds alternate
the two sides and repeat; each round's ratio is in the JSON, the median is the figure.

    python benchmarks/bench_attach_cost.py --out benchmarks/results/attach_cost_cpu.json

The server runs the demo model by default (--model for another); the load is
--concurrency streams of --max-tokens tokens each, --requests in all per side.
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvdeck.app.attach.remote_client import RemoteClient  # noqa: E402
from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from tests.serve.conftest import free_port  # noqa: E402


async def one_side(url: str, model: str, requests: int, concurrency: int, max_tokens: int,
                   watched: bool) -> dict:
    snapshots = 0
    watcher = None
    attached = RemoteClient(url)
    if watched:
        await attached.start()

        async def watch() -> None:
            nonlocal snapshots
            async for _ in attached.stats_stream():
                snapshots += 1

        watcher = asyncio.ensure_future(watch())
        await asyncio.sleep(0.5)
    queue = list(range(requests))
    tokens = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            queue.pop()
            body = {"model": model, "prompt": "The block table maps", "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            response = await http.post(f"{url}/v1/completions", json=body, timeout=600)
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    async with httpx.AsyncClient() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    if watcher is not None:
        watcher.cancel()
    await attached.shutdown()
    return {"output_tokens_per_s": tokens / elapsed, "seconds": elapsed,
            "snapshots_per_s": snapshots / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "kvdeck.app.cli", "--serve", "--model",
                               args.model, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        run = lambda watched: asyncio.run(one_side(url, model, args.requests,  # noqa: E731
                                                   args.concurrency, args.max_tokens, watched))
        run(False)  # warm-up
        rounds = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            sides = {watched: run(watched) for watched in order}
            ratio = sides[True]["output_tokens_per_s"] / sides[False]["output_tokens_per_s"]
            rounds.append({"unwatched": sides[False], "watched": sides[True], "ratio": ratio})
            print(f"round {i}: unwatched {sides[False]['output_tokens_per_s']:.0f} tok/s, "
                  f"watched {sides[True]['output_tokens_per_s']:.0f} tok/s "
                  f"({sides[True]['snapshots_per_s']:.1f} snapshots/s), ratio {ratio:.3f}")
    finally:
        server.terminate()
        server.wait(30)
    ratios = [r["ratio"] for r in rounds]
    figures = {"watched_over_unwatched_median": statistics.median(ratios),
               "ratios": ratios, "rounds": rounds, "load_average": os.getloadavg()}
    print(f"median watched / unwatched throughput: {figures['watched_over_unwatched_median']:.3f}")
    if args.out:
        config = {k: getattr(args, k) for k in ("model", "rounds", "requests", "concurrency",
                                                 "max_tokens")}
        write_json_atomic(args.out, build_result("attach_cost", config, figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

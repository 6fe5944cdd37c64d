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
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.serve_process import kvdeck_server  # noqa: E402
from kvdeck.app.bench.result import build_result, write_json_atomic  # noqa: E402
from kvdeck.engine.types.stats import stats_from_dict, stats_to_dict  # noqa: E402

WATCHER = """
import asyncio, resource, sys
from kvdeck.app.attach.remote_client import RemoteClient

async def watch():
    client = RemoteClient(sys.argv[1])
    await client.start()
    count = 0
    async def read():
        nonlocal count
        async for _ in client.stats_stream():
            count += 1
    task = asyncio.ensure_future(read())
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    task.cancel()
    await client.shutdown()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(count, usage.ru_utime + usage.ru_stime, flush=True)

asyncio.run(watch())
"""

# Reads the same stream's bytes and parses nothing: the server's side of the cost alone.
RAW_WATCHER = """
import resource, sys, threading
import httpx

count = 0

def read():
    global count
    with httpx.stream("GET", sys.argv[1] + "/kvdeck/v1/stats", timeout=None) as response:
        for chunk in response.iter_raw():
            count += chunk.count(b"event: stats")

threading.Thread(target=read, daemon=True).start()
sys.stdin.readline()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(count, usage.ru_utime + usage.ru_stime, flush=True)
"""


async def one_side(url: str, model: str, requests: int, concurrency: int, max_tokens: int,
                   watched: bool, watcher_code: str = WATCHER) -> dict:
    # The dashboard is its own process, as `kvdeck attach` is (on this one machine it still
    # competes for the same cores, so the figure is an upper bound on the server's cost).
    watcher = None
    if watched:
        watcher = subprocess.Popen([sys.executable, "-c", watcher_code, url], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, cwd=REPO)
        await asyncio.sleep(2.0)  # imported and connected
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
    side = {"output_tokens_per_s": tokens / elapsed, "seconds": elapsed}
    if watcher is not None:
        out, _ = watcher.communicate("stop\n", timeout=60)
        snapshots, cpu_s = out.split()
        side["snapshots_per_s"] = int(snapshots) / elapsed
        side["watcher_cpu_s"] = float(cpu_s)  # includes its start-up (imports)
    return side


async def encoding_cost(url: str, model: str, concurrency: int, max_tokens: int) -> dict:
    """The server's own work per snapshot (to the stats stream's JSON), timed here on a
    snapshot it sent while busy: the part of the cost that does not depend on where the
    dashboard runs."""
    async with httpx.AsyncClient(timeout=600) as http:
        body = {"model": model, "prompt": "The block table maps", "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True}
        load = asyncio.gather(*(http.post(f"{url}/v1/completions", json=body)
                                for _ in range(concurrency)))
        snapshot = None
        async with http.stream("GET", f"{url}/kvdeck/v1/stats") as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"stats"' in line[:20]:
                    stats = stats_from_dict(json.loads(line[6:])["stats"])
                    if len(stats.requests) >= concurrency // 2:
                        snapshot = stats
                        break
        await load
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        encoded = json.dumps({"stats": stats_to_dict(snapshot)}, separators=(",", ":"))
    return {"encode_ms_per_snapshot": (time.perf_counter() - start) / rounds * 1e3,
            "bytes_per_snapshot": len(encoded), "num_blocks": snapshot.num_blocks,
            "num_requests": len(snapshot.requests)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--watcher", choices=("kvdeck", "raw"), default="kvdeck",
                        help="kvdeck: the attach client, parsing every snapshot; raw: reads the "
                             "bytes only (the server's cost without the dashboard's own CPU)")
    parser.add_argument("--engine-threads", type=int, default=0,
                        help="the server's torch threads (OMP_NUM_THREADS; 0: torch's default). "
                             "On a 2-core machine 1 leaves a core to the load generator, the "
                             "server's front-end and the dashboard, as a GPU would")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    server_env = dict(os.environ)
    if args.engine_threads:
        server_env["OMP_NUM_THREADS"] = str(args.engine_threads)
    with kvdeck_server(args.model, server_env) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        code = WATCHER if args.watcher == "kvdeck" else RAW_WATCHER
        run = lambda watched: asyncio.run(one_side(url, model, args.requests,  # noqa: E731
                                                   args.concurrency, args.max_tokens, watched,
                                                   code))
        run(False)  # warm-up
        encoding = asyncio.run(encoding_cost(url, model, args.concurrency, args.max_tokens))
        rounds = []
        for i in range(args.rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            sides = {watched: run(watched) for watched in order}
            ratio = sides[True]["output_tokens_per_s"] / sides[False]["output_tokens_per_s"]
            rounds.append({"unwatched": sides[False], "watched": sides[True], "ratio": ratio})
            print(f"round {i}: unwatched {sides[False]['output_tokens_per_s']:.0f} tok/s, "
                  f"watched {sides[True]['output_tokens_per_s']:.0f} tok/s "
                  f"({sides[True]['snapshots_per_s']:.1f} snapshots/s, "
                  f"watcher CPU {sides[True]['watcher_cpu_s']:.1f} s), ratio {ratio:.3f}")
    ratios = [r["ratio"] for r in rounds]
    figures = {"watched_over_unwatched_median": statistics.median(ratios),
               "ratios": ratios, "rounds": rounds, "load_average": os.getloadavg(),
               "server_encoding": encoding}
    print(f"encoding a busy snapshot: {encoding['encode_ms_per_snapshot']:.2f} ms, "
          f"{encoding['bytes_per_snapshot']:,} bytes ({encoding['num_blocks']:,} blocks, "
          f"{encoding['num_requests']} requests)")
    print(f"median watched / unwatched throughput: {figures['watched_over_unwatched_median']:.3f}")
    if args.out:
        config = {k: getattr(args, k) for k in ("model", "rounds", "requests", "concurrency",
                                                 "max_tokens", "watcher", "engine_threads")}
        write_json_atomic(args.out, build_result("attach_cost", config, figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

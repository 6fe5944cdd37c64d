"""`kvdeck bench serve`: Poisson-arrival streaming load against an OpenAI-compatible server
(kvdeck --serve, vLLM, ...), with vLLM's serving-benchmark metric definitions:
TTFT (request sent -> first token), ITL (gap between streamed chunks), TPOT
((latency - TTFT) / (output tokens - 1)), end-to-end latency.

With `--baseline llama.cpp` the same requests (the same token ids: the pool is what both
servers' tokenizers give for one text) go to a llama-server too, in turns with the server
under test, and each pair's ratios are kept. The flags are defined in kvdeck.app.cli.bench.
"""

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    chunk_times: list[tuple[float, int]] = field(default_factory=list)


async def _send(client, url: str, headers: dict, payload: dict, timeout: float) -> RequestResult:
    result = RequestResult(prompt_tokens=len(payload["prompt"]))
    started = time.perf_counter()
    last = started
    try:
        async with client.stream("POST", url, json=payload, headers=headers, timeout=timeout) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:200]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"].get("completion_tokens", result.output_tokens)
                choices = chunk.get("choices") or []
                if not choices or not choices[0].get("text"):
                    continue
                now = time.perf_counter()
                if result.ttft_s is None:
                    result.ttft_s = now - started
                else:
                    result.itl_s.append(now - last)
                result.chunk_times.append((time.time(), 1))
                last = now
        result.latency_s = time.perf_counter() - started
        result.ok = result.ttft_s is not None
        if not result.ok:
            result.error = "the stream ended without a token"
    except Exception as exc:  # network errors of every kind count as failed requests
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _run(args, base_url: str, requests, model: str, headers: dict) -> tuple[list[RequestResult], float]:
    import httpx

    rng = random.Random(args.seed)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    url = base_url.rstrip("/") + "/v1/completions"

    async with httpx.AsyncClient() as client:
        async def one(req) -> RequestResult:
            payload = {
                "model": model, "prompt": req.prompt_token_ids, "max_tokens": req.output_len,
                "temperature": 0.0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True},
            }
            if limit is None:
                return await _send(client, url, headers, payload, args.timeout)
            async with limit:
                return await _send(client, url, headers, payload, args.timeout)

        tasks = []
        started = time.perf_counter()
        for req in requests:
            tasks.append(asyncio.create_task(one(req)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - started


_SAMPLE_TEXT = (
    "The engine schedules requests in blocks of sixteen tokens, reuses cached prefixes, "
    "and streams every answer back; 0123456789 quick brown fox, jumps over lazy dogs!"
)


def _server_info(base_url: str, headers: dict, model: str | None) -> tuple[str, list[int]]:
    """The model name to ask for, and token ids the server's tokenizer certainly has."""
    import httpx

    base = base_url.rstrip("/")
    resp = httpx.get(base + "/v1/models", headers=headers, timeout=10)
    if resp.status_code != 200:
        raise ValueError(f"{base_url}/v1/models answered {resp.status_code}: {resp.text[:200]}")
    models = resp.json().get("data") or []
    if not models:
        raise ValueError(f"{base_url} serves no model")
    name = model or models[0]["id"]
    tokens = _tokenize(base, headers, name)
    if tokens:
        return name, sorted(set(tokens))
    return name, list(range(1000))  # servers without /tokenize: ids every real vocabulary has


def _tokenize(base: str, headers: dict, name: str) -> list[int] | None:
    """The sample text's token ids: vLLM's and kvdeck's `/tokenize` take `prompt`, llama.cpp's
    takes `content` (and answers an empty list to `prompt`); both answer `tokens`."""
    import httpx

    for body in ({"model": name, "prompt": _SAMPLE_TEXT}, {"content": _SAMPLE_TEXT}):
        resp = httpx.post(base + "/tokenize", json=body, headers=headers, timeout=10)
        tokens = resp.json().get("tokens") if resp.status_code == 200 else None
        if tokens:
            return [t if isinstance(t, int) else t["id"] for t in tokens]
    return None


def run_serve_benchmark(args: argparse.Namespace) -> int:
    from kvdeck.app.bench.plot import plot_serving
    from kvdeck.app.bench.result import build_result, write_json_atomic
    from kvdeck.app.bench.throughput import parse_range, synthetic_requests

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    import httpx

    try:
        model, token_pool = _server_info(args.base_url, headers, args.model)
    except (OSError, httpx.HTTPError) as exc:
        raise ValueError(f"cannot reach a server at {args.base_url}: {exc}") from None
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    input_len = parse_range(args.input_len, "--input-len")
    output_len = parse_range(args.output_len, "--output-len")
    baseline = None
    if args.baseline == "llama.cpp":
        from kvdeck.app.bench.serve_llama_cpp import LlamaCppServeBaseline

        baseline = LlamaCppServeBaseline.open(args, input_len[1] + output_len[1])
        token_pool = baseline.shared_pool(token_pool)
    # Each repeat its own prompts (seed + repeat), the same for both sides of a pair: a
    # replayed workload would time the servers' prompt caches (llama-server keeps whole
    # prompts, kvdeck full blocks of them), not their prefill.
    workloads = []
    for repeat in range(args.repeats):
        requests = synthetic_requests(args.num_prompts, input_len, output_len, len(token_pool),
                                      args.seed + repeat)
        for r in requests:
            r.prompt_token_ids = [token_pool[i] for i in r.prompt_token_ids]
        workloads.append(requests)
    print(f"bench serve: {args.num_prompts} requests to {args.base_url} ({model}), rate "
          f"{args.request_rate}/s, concurrency {args.max_concurrency or 'unbounded'}", file=sys.stderr)
    runs_by_side: dict[str, int] = {}

    def measure(base_url: str, name: str, auth: dict) -> tuple[dict, list[RequestResult]]:
        repeat = runs_by_side.get(base_url, 0)
        runs_by_side[base_url] = repeat + 1
        results, duration = asyncio.run(_run(args, base_url, workloads[repeat % len(workloads)], name, auth))
        return summarise(results, duration), results

    config = {"base_url": args.base_url, "model": model, "num_prompts": args.num_prompts,
              "input_len": list(input_len), "output_len": list(output_len), "seed": args.seed,
              "prompts": "new each repeat (seed + repeat), the same for both sides of a pair",
              "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
              "repeats": args.repeats}
    try:
        if baseline is None:
            runs = [measure(args.base_url, model, headers) for _ in range(args.repeats)]
            figures, results = sorted(runs, key=lambda run: run[0]["tpot_ms"]["p50"])[(len(runs) - 1) // 2]
            shown = figures
        else:
            figures, results = baseline.compare(measure, args.base_url, model, headers)
            config["baseline"] = baseline.config()
            shown = figures["kvdeck"]
    finally:
        if baseline is not None:
            baseline.close()
    result = build_result("serve", config, figures, argv=args._argv)
    _print(shown)
    if baseline is not None:
        baseline.print_ratios(figures)
    if args.out:
        write_json_atomic(args.out, result)
    done = [r for r in results if r.ok]
    if args.plot:
        per_request = [{"ttft_s": r.ttft_s, "itl_s": r.itl_s} for r in done]
        timeline = sorted(t for r in done for t in r.chunk_times)
        plot_serving({**result, **shown}, per_request, timeline, args.plot)
    return 0 if done else 1


def summarise(results: list[RequestResult], duration: float) -> dict:
    """vLLM's serving figures for one run of the workload."""
    from kvdeck.app.bench.result import percentiles

    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return {
        "duration_s": duration,
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "request_throughput": len(done) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "total_tokens_per_s": (output_tokens + sum(r.prompt_tokens for r in done)) / duration,
        "ttft_ms": _ms(percentiles([r.ttft_s for r in done])),
        "tpot_ms": _ms(percentiles(tpot)),
        "itl_ms": _ms(percentiles([x for r in done for x in r.itl_s])),
        "e2e_latency_ms": _ms(percentiles([r.latency_s for r in done])),
    }


def _ms(stats: dict[str, float]) -> dict[str, float]:
    return {k: v * 1000 for k, v in stats.items()}


def _print(f: dict) -> None:
    print(f"completed {f['completed']}, failed {f['failed']} in {f['duration_s']:.1f} s")
    print(f"throughput: {f['request_throughput']:.2f} req/s, {f['output_tokens_per_s']:.1f} output tok/s")
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        s = f[key]
        print(f"{key:>15}: mean {s['mean']:8.1f}  p50 {s['p50']:8.1f}  p90 {s['p90']:8.1f}  "
              f"p99 {s['p99']:8.1f}")
    for error in f["errors"]:
        print(f"error: {error}")

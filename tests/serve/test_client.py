"""AsyncLLM (the engine in a background process) used directly, as the TUI uses it."""

import asyncio
import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.api import async_llm
from kvdeck.engine.api.async_llm import AsyncLLM, EngineDeadError, EngineStartError
from kvdeck.engine.types.structured import StructuredOutputsParams
from tests.serve.conftest import KV_GIB

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def one_engine_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by the spawned engine process


async def next_stats(client: AsyncLLM, predicate, timeout: float = 10.0):
    async def wait():
        async for stats in client.stats_stream():
            if predicate(stats):
                return stats

    return await asyncio.wait_for(wait(), timeout)


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


async def test_client_lifecycle(serve_model_dir):
    client = AsyncLLM(str(serve_model_dir), kv_cache_memory_gib=float(KV_GIB))
    assert client.health().status == "stopped"
    stages = []
    await client.start(on_progress=lambda p: stages.append(p.stage))
    try:
        assert stages[0] == "starting" and stages[-1] == "ready" and "loading" in stages
        assert client.health().status == "ready"
        assert client.max_model_len == 512 and client.tokenizer.vocab_size > 0

        # streamed deltas add up to the offline engine's greedy text
        greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        offline = LLM(str(serve_model_dir), kv_cache_memory_gib=float(KV_GIB))
        want = offline.generate("Paged attention", greedy)[0].outputs[0]
        text, last = "", None
        async for out in client.generate("Paged attention", greedy):
            text += out.delta_text
            last = out
        assert last.finished and last.outputs[0].finish_reason == "length"
        assert text == last.outputs[0].text == want.text
        assert last.outputs[0].token_ids == want.token_ids
        assert last.metrics.first_token_time >= last.metrics.arrival_time

        # chat template on the client side
        messages = [{"role": "user", "content": "hello"}]
        chat_want = offline.chat(messages, greedy)[0].outputs[0].text
        chat = [out async for out in client.generate(None, greedy, messages=messages)]
        assert chat[-1].outputs[0].text == chat_want

        # a stop string ends the request and frees its blocks in the core (max_tokens far past
        # the stop: the core must not reach the length limit before the front-end's abort)
        stop = want.text[4:7]
        params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, stop=[stop])
        outs = [out async for out in client.generate("Paged attention", params)]
        assert outs[-1].outputs[0].text == want.text[: want.text.index(stop)]
        assert outs[-1].outputs[0].finish_reason == "stop"
        ended = outs[-1].metrics.finished_time
        idle = await next_stats(client, lambda s: s.timestamp > ended and s.num_running == 0)
        assert idle.kv_cache_usage == 0 and idle.finished_reasons.get("stop", 0) >= 1

        # bad input fails before anything is queued
        for bad in ("", [client.vocab_size + 5], "word " * 600):
            with pytest.raises(ValueError):
                async for _ in client.generate(bad, greedy):
                    pass
        assert client.num_unfinished == 0

        # abort: the stream ends with "abort" and the blocks come back
        long = SamplingParams(max_tokens=400, ignore_eos=True)
        outputs = []

        async def consume():
            async for out in client.generate("abort me", long, request_id="victim"):
                outputs.append(out)

        task = asyncio.create_task(consume())
        busy = await next_stats(client, lambda s: any(r.request_id == "victim" and r.block_table
                                                      for r in s.requests))
        assert busy.kv_cache_usage > 0
        await client.abort("victim")
        await asyncio.wait_for(task, 5)
        assert outputs[-1].outputs[0].finish_reason == "abort"
        assert len(outputs[-1].outputs[0].token_ids) < 400
        idle = await next_stats(client, lambda s: s.num_running == 0 and s.kv_cache_usage == 0)
        assert idle.finished_reasons.get("abort") == 1

        # a consumer that stops listening aborts its request too
        async for _ in client.generate("walk away", long):
            break
        idle = await next_stats(client, lambda s: s.finished_reasons.get("abort") == 2)
        assert idle.num_running == 0 and idle.kv_cache_usage == 0

        # n choices are one request: outputs by choice index, one abort for all of them
        pair = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
        finals = await (await client.add_request("pair", "Paged attention", pair)).final_outputs()
        want_pair = offline.generate("Paged attention", pair)[0].outputs
        assert [f.outputs[0].text for f in finals] == [c.text for c in want_pair]
        assert {f.request_id for f in finals} == {"pair"} and finals[-1].finished
        three = SamplingParams(n=3, max_tokens=400, ignore_eos=True)
        stream = await client.add_request("three", "abort us", three)
        await asyncio.wait_for(stream.__anext__(), 10)
        await client.abort("three")
        rest = [out async for out in stream]
        assert sorted(o.outputs[0].index for o in rest if o.outputs[0].finish_reason == "abort") == [0, 1, 2]
        assert rest[-1].finished and client.num_unfinished == 0
        idle = await next_stats(client, lambda s: s.finished_reasons.get("abort") == 5)
        assert idle.num_running == 0 and idle.kv_cache_usage == 0

        # the engine dies: pending streams and stats streams raise, health says why
        pid = client.pid
        stats_task = asyncio.create_task(next_stats(client, lambda s: False, timeout=30))
        stream = await client.add_request(None, "doomed", long)
        first = await asyncio.wait_for(stream.__anext__(), 10)
        assert not first.finished
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        with pytest.raises(EngineDeadError):
            await stats_task
        health = client.health()
        assert health.status == "dead" and "SIGKILL" in health.detail
        with pytest.raises(EngineDeadError):
            async for _ in client.generate("after death", greedy):
                pass

        # restart brings it back
        await client.restart()
        assert client.health().status == "ready" and client.pid != pid
        again = [out async for out in client.generate("Paged attention", greedy)]
        assert again[-1].outputs[0].text == want.text
    finally:
        pid = client.pid
        await client.shutdown()
    assert client.health().status == "stopped"
    assert pid is None or process_gone(pid)


async def test_a_grammar_check_runs_off_the_event_loop(serve_model_dir, monkeypatch):
    """The front-end checks a request's grammar in the tokenizer's thread: held there (as a
    slow check that releases the GIL would be), a running stream goes on to its end while
    the constrained request waits to be queued; released, the constrained request runs."""
    held = threading.Event()
    check = async_llm.checked_grammar

    def slow_check(spec):
        assert held.wait(60), "the test never released the check"
        check(spec)

    client = AsyncLLM(str(serve_model_dir), kv_cache_memory_gib=float(KV_GIB))
    await client.start()
    try:
        free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
        stream = await client.add_request(None, "Paged attention", free)
        monkeypatch.setattr(async_llm, "checked_grammar", slow_check)
        constrained = asyncio.ensure_future(client.add_request(None, "Yes or no?", SamplingParams(
            max_tokens=8, structured_outputs=StructuredOutputsParams(choice=("yes", "no")))))
        try:
            outputs = [out async for out in stream]
            assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 40
            assert not constrained.done()
        finally:
            held.set()
        answer = [out async for out in await constrained]
        assert answer[-1].outputs[0].text in ("yes", "no")
    finally:
        await client.shutdown()


async def test_start_failure_is_reported(serve_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(serve_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["architectures"] = ["NoSuchForCausalLM"]
    (broken / "config.json").write_text(json.dumps(config))
    client = AsyncLLM(str(broken), kv_cache_memory_gib=float(KV_GIB))
    with pytest.raises(EngineStartError, match="NoSuchForCausalLM"):
        await client.start()
    assert client.health().status == "dead"
    assert client.pid is None

    missing = AsyncLLM(str(tmp_path / "nowhere"))
    with pytest.raises(EngineStartError, match="nowhere"):
        await missing.start()

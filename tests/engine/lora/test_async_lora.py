"""The LoRA interface over the engine's own process (AsyncLLM, the subprocess core client):
add_lora / remove_lora / list_loras as utility calls, a request's lora_request, and bad
adapters as the caller's ValueError, with the engine alive afterwards."""

import pytest

from kvdeck import LoRARequest, SamplingParams
from kvdeck.engine.api.async_llm import AsyncLLM
from tests.engine.lora.conftest import MAX_NEW, PROMPTS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def one_engine_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by the spawned engine process


async def test_adapters_through_the_engine_process(lora_llama, tmp_path):
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    greedy = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    client = AsyncLLM(str(setup.model_dir), enable_lora=True, max_loras=2, num_gpu_blocks_override=64,
                      max_model_len=128)
    await client.start()
    try:
        assert await client.add_lora(sql) is True
        assert await client.add_lora(sql) is False
        assert await client.list_loras() == [1]
        with pytest.raises(ValueError, match="does not exist"):
            await client.add_lora(LoRARequest("gone", 9, str(tmp_path / "nowhere")))
        # A request naming an adapter the engine does not hold loads it; each gets its own.
        outs = [out async for out in client.generate(PROMPTS[2], greedy, lora_request=code)]
        assert list(outs[-1].outputs[0].token_ids) == setup.expected("code", 2)
        assert await client.list_loras() == [1, 2]
        outs = [out async for out in client.generate(PROMPTS[1], greedy, lora_request=sql)]
        assert list(outs[-1].outputs[0].token_ids) == setup.expected("sql", 1)
        # A bad adapter is the request's error; the engine goes on.
        with pytest.raises(ValueError, match="does not exist"):
            async for _ in client.generate(PROMPTS[0], greedy, lora_request=LoRARequest("x", 5, "/nowhere")):
                pass
        assert await client.remove_lora(1) is True
        assert await client.remove_lora(1) is False
        assert await client.list_loras() == [2]
        assert client.health().status == "ready"
    finally:
        await client.shutdown()


async def test_a_lora_request_needs_lora_on(lora_llama):
    client = AsyncLLM(str(lora_llama.model_dir))
    with pytest.raises(ValueError, match="LoRA is off"):
        await client.add_lora(lora_llama.requests["sql"])

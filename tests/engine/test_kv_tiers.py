"""The prefix cache's host and disk tiers (engine/core/kv_tiers.py): a restart reuses blocks
from disk with output unchanged, another model / dtype / block size never does, damaged files
are ignored and removed, the folder's size bound holds, the host tier recalls evicted blocks,
and nothing leaks after aborts."""

import os
import threading
from pathlib import Path

import pytest

from kvdeck import LLM, SamplingParams
from kvdeck.engine.core.kv_disk_store import DiskBlockStore, chain_key
from kvdeck.engine.core.kv_fingerprint import model_fingerprint

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = list(range(10, 10 + 100))  # 6 full blocks of 16 (the 100th token is never cached)
POOL = dict(kv_cache_memory_gib=0.01)


def _generate(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, PARAMS)]


@pytest.fixture(scope="module")
def expected(tiny_llama_dir) -> list[int]:
    with LLM(str(tiny_llama_dir), **POOL) as llm:
        return _generate(llm, [PROMPT])[0]


def _populate(model: Path, cache: Path, **config) -> None:
    with LLM(str(model), kv_cache_dir=str(cache), **POOL, **config) as llm:
        _generate(llm, [PROMPT])


def _files(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.kvb"))


@pytest.mark.parametrize("config", [{}, {"kv_cache_dtype": "int8"}, {"async_scheduling": True}],
                         ids=["auto", "int8", "async"])
def test_restart_reuses_disk_blocks_and_output_is_unchanged(tiny_llama_dir, tmp_path, expected, config):
    cache = tmp_path / "kv"
    _populate(tiny_llama_dir, cache, **config)
    assert len(_files(cache)) == 6  # flushed at shutdown
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL, **config) as llm:
        out = llm.generate([PROMPT], PARAMS)[0]
        stats = llm.stats()
    assert out.num_cached_tokens == 96
    assert stats.disk_cache_hits == 96 and stats.disk_cache_queries == 96
    if not config:
        assert out.outputs[0].token_ids == expected
    else:  # int8 K/V differ from the model dtype's: compare with the same config, no tier
        with LLM(str(tiny_llama_dir), **POOL, **config) as plain:
            assert out.outputs[0].token_ids == _generate(plain, [PROMPT])[0]


def test_per_request_stats_name_the_tier(tiny_llama_dir, tmp_path):
    cache = tmp_path / "kv"
    _populate(tiny_llama_dir, cache)
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL) as llm:
        engine = llm.engine
        engine.add_request("r", PROMPT, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        engine.step()
        (request,) = engine.stats().requests
        assert request.num_disk_cached_tokens == 96 and request.num_host_cached_tokens == 0
        assert request.num_cached_tokens == 96


@pytest.mark.parametrize("changed", [{"dtype": "float32"}, {"block_size": 32}, {"model": "qwen2"}],
                         ids=["dtype", "block_size", "model"])
def test_another_model_dtype_or_block_size_never_reuses(tiny_model_dirs, tmp_path, changed):
    cache = tmp_path / "kv"
    _populate(tiny_model_dirs["llama"], cache, dtype="bfloat16")
    config = {"dtype": "bfloat16", **changed}
    model = tiny_model_dirs[config.pop("model", "llama")]
    with LLM(str(model), kv_cache_dir=str(cache), **POOL, **config) as llm:
        out = llm.generate([PROMPT], PARAMS)[0]
        assert llm.stats().disk_cache_hits == 0 and out.num_cached_tokens == 0
    assert len(list(cache.iterdir())) == 2  # a folder per fingerprint


def test_fingerprint_follows_the_weights_files(tiny_llama_dir, tmp_path):
    args = dict(dtype="bfloat16", kv_format="bfloat16", block_size=16, part_sizes=[8, 8],
                load_format="auto", seed=0, quantization=None)
    before = model_fingerprint(tiny_llama_dir, **args)
    assert model_fingerprint(tiny_llama_dir, **args) == before
    assert model_fingerprint(tiny_llama_dir, **{**args, "kv_format": "int8"}) != before
    assert model_fingerprint(tiny_llama_dir, **{**args, "load_format": "dummy"}) != before
    weights = next(tiny_llama_dir.glob("*.safetensors"))
    stat = weights.stat()
    try:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # re-written weights
        assert model_fingerprint(tiny_llama_dir, **args) != before
    finally:
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_truncated_or_corrupt_files_are_ignored_and_removed(tiny_llama_dir, tmp_path, expected):
    cache = tmp_path / "kv"
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL) as llm:
        _generate(llm, [PROMPT])
        tiers = llm.engine.core.kv_tiers
        paths = [tiers.disk.path_of(key) for key in tiers._disk_keys(_probe(PROMPT), 6)]
    assert all(path.is_file() for path in paths)
    truncated, corrupt = paths[2], paths[4]
    truncated.write_bytes(truncated.read_bytes()[:-100])
    data = bytearray(corrupt.read_bytes())
    data[-7] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    # Each restart stops at the first damaged file, removes it, recomputes from there and
    # writes what is missing again; the output never changes.
    for hit_blocks, removed in ((2, 1), (4, 1), (6, 0)):
        with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL) as llm:
            out = llm.generate([PROMPT], PARAMS)[0]
            assert llm.engine.core.kv_tiers.disk.counters.corrupt_removed == removed
        assert out.num_cached_tokens == hit_blocks * 16
        assert out.outputs[0].token_ids == expected


def _probe(tokens: list[int]):
    """A request with these tokens, to compute its disk keys."""
    from kvdeck.engine.core.request import Request

    return Request("probe", list(tokens), PARAMS, set())


def test_size_bound_evicts_least_recently_used(tmp_path):
    parts = [64, 64]
    one = DiskBlockStore(tmp_path, "m", parts, max_bytes=1)  # only to learn a file's size
    one.close()
    size = one.file_bytes + 8 * 4
    store = DiskBlockStore(tmp_path, "m", parts, max_bytes=3 * size)
    keys = [chain_key(b"root", [i, i, i, i]) for i in range(5)]
    payload = memoryview(bytes(range(128)))
    for i, key in enumerate(keys[:3]):
        assert store.write(key, [i] * 4, payload)
    store.flush()
    out = bytearray(128)
    assert store.read(keys[0], [0] * 4, memoryview(out)) and out == bytes(range(128))  # 0 used last
    for i, key in enumerate(keys[3:], start=3):
        store.write(key, [i] * 4, payload)
        store.flush()
    assert store.total_bytes <= 3 * size
    on_disk = {p.name for p in tmp_path.rglob("*.kvb")}
    assert on_disk == {store.path_of(k).name for k in (keys[0], keys[3], keys[4])}
    store.close()
    # A new process sees the same files (their mtimes say their use), and a smaller bound
    # evicts at start: keys[0] was used before keys[3] and keys[4] were written.
    again = DiskBlockStore(tmp_path, "m", parts, max_bytes=2 * size)
    assert again.num_blocks == 2 and again.contains(keys[3]) and again.contains(keys[4])
    assert len(list(tmp_path.rglob("*.kvb"))) == 2
    again.close()


def test_write_queue_full_drops_instead_of_waiting(tmp_path):
    store = DiskBlockStore(tmp_path, "m", [16], max_bytes=2**20, queue_bytes=16)
    release = threading.Event()
    write_file = store._write_file

    def slow_write(*args):
        release.wait(10)
        write_file(*args)

    store._write_file = slow_write  # the disk is slow: the first write holds the queue
    payload = memoryview(bytes(16))
    accepted = [store.write(chain_key(b"r", [i]), [i], payload) for i in range(20)]
    release.set()
    store.close()
    assert accepted == [True] + [False] * 19
    assert store.counters.writes == 1 and store.counters.writes_dropped == 19


def test_host_tier_recalls_evicted_blocks(tiny_llama_dir, expected):
    small = dict(num_gpu_blocks_override=16, max_model_len=128)
    others = [[(i * (j + 3) + j) % 390 + 5 for i in range(100)] for j in range(3)]
    with LLM(str(tiny_llama_dir), **small) as plain:
        want = _generate(plain, [PROMPT] + others)
    with LLM(str(tiny_llama_dir), kv_offload_gib=0.001, **small) as llm:
        assert _generate(llm, [PROMPT]) == [want[0]]
        for prompt in others:  # each evicts the blocks before it from the 16-block pool
            _generate(llm, [prompt])
        stats = llm.stats()
        assert stats.host_cache_blocks > 0
        out = llm.generate([PROMPT], PARAMS)[0]
        stats = llm.stats()
        assert stats.host_cache_hits == 96 and out.num_cached_tokens == 96
        assert out.outputs[0].token_ids == want[0] == expected
        assert _generate(llm, others) == want[1:]


def test_no_leak_after_aborts(tiny_llama_dir, tmp_path):
    cache = tmp_path / "kv"
    _populate(tiny_llama_dir, cache)
    small = dict(num_gpu_blocks_override=24, max_model_len=160)
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), kv_offload_gib=0.001, **small) as llm:
        engine, core = llm.engine, llm.engine.core
        params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        for round_ in range(3):
            ids = [f"{round_}-{i}" for i in range(4)]
            for i, request_id in enumerate(ids):
                prompt = PROMPT if i % 2 == 0 else [(t * (i + 2) + round_) % 390 + 5 for t in range(60)]
                engine.add_request(request_id, prompt, params)
            for _ in range(round_ + 1):
                engine.step()
            engine.abort_request(ids)
        manager = core.block_manager
        assert manager.num_free_blocks == manager.num_blocks
        assert all(block.ref_count == 0 for block in manager.blocks)
        assert manager.num_held_entries == 0
        for (group, block_hash), block_id in manager.hash_to_block.items():
            block = manager.blocks[block_id]
            assert block.hash == block_hash and block.group == group
        tiers = core.kv_tiers
        assert tiers.pending.empty and not tiers.to_store
        assert len(tiers.host) + len(tiers._free_rows) == tiers.host_rows
        assert len({entry.row for entry in tiers.host.values()} | set(tiers._free_rows)) == tiers.host_rows
        assert not core.requests


def test_bad_tier_options_are_refused_by_name(tiny_llama_dir):
    with pytest.raises(ValueError, match="kv_offload_gib"):
        LLM(str(tiny_llama_dir), kv_offload_gib=-1)
    with pytest.raises(ValueError, match="kv_cache_dir_gib"):
        LLM(str(tiny_llama_dir), kv_cache_dir="/tmp/x", kv_cache_dir_gib=0)
    with pytest.raises(ValueError, match="kv_offload_gib"):
        LLM(str(tiny_llama_dir), kv_offload_gib=1e-9, **POOL)


def test_lora_blocks_are_keyed_by_the_adapter_files(tiny_llama_dir, tmp_path):
    from kvdeck import LoRARequest
    from tests.lora_factory import build_adapter

    adapter = build_adapter(tiny_llama_dir, tmp_path / "adapter", rank=4, seed=3)
    cache = tmp_path / "kv"
    config = dict(kv_cache_dir=str(cache), enable_lora=True, max_loras=1, max_lora_rank=8, **POOL)

    def run() -> tuple[int, list[int], int]:
        with LLM(str(tiny_llama_dir), **config) as llm:
            out = llm.generate([PROMPT], PARAMS, lora_request=LoRARequest("a", 1, str(adapter)))[0]
            return out.num_cached_tokens, out.outputs[0].token_ids, llm.stats().disk_cache_blocks

    _, first, _ = run()
    cached, again, _ = run()
    assert cached == 96 and again == first
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL) as base:  # the base model's own
        assert base.generate([PROMPT], PARAMS)[0].num_cached_tokens == 0
    weights = next(adapter.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    cached, retrained, _ = run()  # the adapter's files changed: its old blocks are not used
    assert cached == 0 and retrained == first


async def test_engine_process_leaves_its_blocks_on_disk(tiny_llama_dir, tmp_path, expected):
    """The TUI's and the server's engine runs in a process of its own: stopping it writes what
    its disk tier still had queued."""
    from kvdeck.engine.api.async_llm import AsyncLLM

    cache = tmp_path / "kv"
    client = AsyncLLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL)
    await client.start()
    try:
        outputs = [out async for out in client.generate(PROMPT, PARAMS)]
    finally:
        await client.shutdown()
    assert outputs[-1].outputs[0].token_ids == expected
    assert len(_files(cache)) == 6
    with LLM(str(tiny_llama_dir), kv_cache_dir=str(cache), **POOL) as llm:
        out = llm.generate([PROMPT], PARAMS)[0]
    assert out.num_cached_tokens == 96 and out.outputs[0].token_ids == expected


def test_tiers_are_off_with_a_warning_for_several_kv_groups(tmp_path, caplog):
    from tests.model_factory import build_tiny_model

    model = build_tiny_model(tmp_path / "gemma2", "gemma2")  # local and global layers
    with caplog.at_level("WARNING"), LLM(str(model), kv_cache_dir=str(tmp_path / "kv"), **POOL) as llm:
        assert llm.engine.core.kv_tiers is None
        assert llm.generate([PROMPT[:40]], PARAMS)[0].outputs[0].token_ids
    assert "several KV cache groups" in caplog.text
    assert not list((tmp_path / "kv").rglob("*.kvb"))

"""The CUDA-graph decode path's static buffers and padding, run without CUDA.

`capture=False` replays the same static-buffer forward eagerly: the inputs are copied into
fixed tensors, padded to a bucket, and the output rows sliced back, exactly as around a
real graph replay. What cannot run here is the capture itself (see
benchmarks/check_cuda_graphs.py for the GPU check).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvdeck import LLM, SamplingParams
from kvdeck.engine.runner.decode_graphs import DecodeGraphs, decode_bucket_sizes, split_tiers
from kvdeck.engine.runner.models.layers import AttentionMetadata
from tests.model_factory import hf_greedy

# The graph machinery, not the native decoder stack, which would take the small steps first.
pytestmark = pytest.mark.usefixtures("no_decoder_stack")

def test_bucket_sizes():
    assert decode_bucket_sizes(1) == [1]
    assert decode_bucket_sizes(5) == [1, 2, 4, 5]
    assert decode_bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert decode_bucket_sizes(256)[-3:] == [224, 240, 256]
    assert decode_bucket_sizes(4096)[-1] == 512


def test_split_tiers_leave_no_empty_segments():
    # Qwen3-0.6B on an H100 (8 KV heads, 132 SMs), max_model_len 40960: batch 1 splits 32 ways
    # at full length, so shorter graphs serve 1, 2, 4, 8 and 16 segments.
    assert split_tiers(1, 40960, 8, 132) == [256, 512, 1024, 2048, 4096]
    assert split_tiers(8, 40960, 8, 132) == [256, 512]  # at most 4 segments at batch 8
    assert split_tiers(64, 40960, 8, 132) == []  # fills the GPU unsplit
    assert split_tiers(1, 1024, 8, 132) == [256, 512]


def test_a_short_step_replays_its_tier(tiny_model_dirs):
    """With an H100's split policy on the static-buffer path (eager replays), a step replays
    the shortest graph covering its longest row, and the tokens stay the model's."""
    path = tiny_model_dirs["llama"]
    llm = LLM(str(path), kv_cache_memory_gib=0.01, max_num_seqs=4, max_model_len=512)
    runner = llm.engine.core.runner
    graphs = DecodeGraphs(runner.model, 4, 512, runner.block_size, runner.model_config.hidden_size,
                          runner.dtype, runner.device, num_kv_heads=runner.model_config.num_key_value_heads,
                          num_sms=132)
    graphs.use_eager_replays()
    assert graphs.tiers[1] == [256] and graphs.tiers[4] == [256]
    replayed = []
    for key, replay in list(graphs.tier_replays.items()):
        graphs.tier_replays[key] = (lambda k=key, r=replay: (replayed.append(k), r())[1])
    for size, replay in list(graphs.replays.items()):
        graphs.replays[size] = (lambda s=size, r=replay: (replayed.append((s, 512)), r())[1])
    runner.decode_graphs = graphs
    tok = llm.get_tokenizer()
    prompts = [tok.encode("Hello there"), tok.encode("The quick brown fox " * 15)]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == hf_greedy(path, prompts, 5)
    assert (2, 256) in replayed  # contexts under 256 tokens: the short graph
    long = llm.generate([tok.encode("Paged attention " * 80)], params)[0].outputs[0].token_ids
    assert (1, 512) in replayed and long == hf_greedy(path, [tok.encode("Paged attention " * 80)], 5)[0]


def _llm_with_static_decode(path, **kwargs) -> LLM:
    llm = LLM(str(path), kv_cache_memory_gib=0.01, **kwargs)
    runner = llm.engine.core.runner
    runner.capture_decode_graphs(llm.engine.core.max_model_len, capture=False)
    assert runner.decode_graphs is not None  # the self-check passed
    return llm


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_padded_static_decode_matches_transformers(tiny_model_dirs, family):
    path = tiny_model_dirs[family]
    llm = _llm_with_static_decode(path, max_num_seqs=12)
    runner = llm.engine.core.runner
    replayed: list[int] = []
    for size, replay in list(runner.decode_graphs.replays.items()):
        runner.decode_graphs.replays[size] = (lambda s=size, r=replay: (replayed.append(s), r())[1])
    tok = llm.get_tokenizer()
    # 5 and 3 live rows run in the 8 and 4 buckets: padding rows are exercised.
    prompts = [tok.encode(p) for p in ("Hello there", "The quick brown fox", "Paged", "a b c d e f",
                                       "Blocks of keys")]
    params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == hf_greedy(path, prompts, 7)
    assert 8 in replayed  # decode steps went through the padded buckets
    assert runner.decode_graphs.logits is not None  # the graphs ran the output head and the argmax
    core = llm.engine.core
    assert core.block_manager.num_free_blocks == core.block_manager.num_blocks


@pytest.mark.parametrize("max_num_seqs", [1, 2])
def test_self_check_fits_batch_one_engines(tiny_llama_dir, max_num_seqs):
    # `bench decode` runs max_num_seqs=1; its self-check once replayed a 3-row step past the
    # only bucket (IndexError on the H100: the engine fell back to eager).
    llm = _llm_with_static_decode(tiny_llama_dir, max_num_seqs=max_num_seqs)
    assert llm.engine.core.runner.decode_graphs.sizes == decode_bucket_sizes(max_num_seqs)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert out[0].outputs[0].token_ids == hf_greedy(tiny_llama_dir, [[5, 6, 7]], 4)[0]


def _decode_meta(slots: list[int], block_size: int) -> tuple:
    """One-token rows, each alone in its own block: row i writes slot slots[i]."""
    n = len(slots)
    tables = torch.tensor([[slot // block_size] for slot in slots], dtype=torch.int32)
    positions = torch.tensor([slot % block_size for slot in slots])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=tables,
        query_start_loc=torch.arange(n + 1, dtype=torch.int32), seq_lens=(positions + 1).int(),
        max_query_len=1, max_seq_len=int(positions.max()) + 1,
    )
    return torch.arange(n) + 3, positions, meta


def test_padding_rows_write_no_kv(tiny_llama_dir):
    llm = _llm_with_static_decode(tiny_llama_dir, max_num_seqs=8)
    runner = llm.engine.core.runner
    graphs, bs = runner.decode_graphs, runner.block_size
    with torch.inference_mode():
        graphs.run(*_decode_meta([0, bs + 1, 2 * bs + 2, 3 * bs + 3], bs))  # fills bucket 4
        for cache in runner.k_caches + runner.v_caches:
            cache.zero_()
        # Three rows in the same bucket: the fourth row of the buffers is padding now.
        hidden = graphs.run(*_decode_meta([4 * bs, 5 * bs + 1, 6 * bs + 2], bs))
    assert hidden.shape[0] == 3
    for cache in runner.k_caches + runner.v_caches:
        written = cache.flatten(2).abs().sum(-1).nonzero().tolist()
        assert written == [[4, 0], [5, 1], [6, 2]]


def test_prefill_and_mixed_steps_stay_eager(tiny_llama_dir):
    llm = _llm_with_static_decode(tiny_llama_dir, max_num_seqs=4, max_num_batched_tokens=8)
    graphs = llm.engine.core.runner.decode_graphs
    calls: list[int] = []
    original_run = graphs.run
    graphs.run = lambda ids, pos, meta: (calls.append(meta.max_query_len), original_run(ids, pos, meta))[1]
    tok = llm.get_tokenizer()
    prompts = [tok.encode("a much longer prompt that needs chunked prefill steps"), tok.encode("hi")]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert calls and set(calls) == {1}


def test_failed_self_check_leaves_engine_eager(tiny_llama_dir, monkeypatch, caplog):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    runner = llm.engine.core.runner

    def corrupt(self):
        self.replays = {size: (lambda size=size: self.buffers.hidden[:size].fill_(7.0))
                        for size in self.sizes}

    monkeypatch.setattr("kvdeck.engine.runner.decode_graphs.DecodeGraphs.use_eager_replays", corrupt)
    runner.capture_decode_graphs(llm.engine.core.max_model_len, capture=False)
    assert runner.decode_graphs is None
    assert "differs from the eager forward" in caplog.text
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


def test_capture_is_cuda_only_and_switchable(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01)
    runner = llm.engine.core.runner
    assert not runner.cuda_graphs_supported  # CPU: never captured
    assert runner.decode_graphs is None
    assert LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.01,
               enforce_eager=True).engine.core.runner.decode_graphs is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_gpu_check_script_refuses_without_cuda():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "check_cuda_graphs.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and "--batch-sizes" in shown.stdout
    refused = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "need a CUDA GPU" in refused.stderr


def test_greedy_decode_steps_take_the_graphs_argmax(tiny_model_dirs, monkeypatch):
    llm = _llm_with_static_decode(tiny_model_dirs["llama"], max_num_seqs=4)
    sampler = llm.engine.core.runner.sampler
    taken = []
    sample_on_device = type(sampler).sample_on_device

    def recording(self, logits, requests, masks=None, greedy=None):
        samples = sample_on_device(self, logits, requests, masks, greedy)
        taken.append(greedy is not None and samples.tokens is greedy)
        return samples

    monkeypatch.setattr(type(sampler), "sample_on_device", recording)
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([[5, 6, 7], [8, 9]], greedy)
    assert any(taken)  # decode steps sampled with the graph's argmax
    taken.clear()
    llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2))
    assert not any(taken)  # logprobs need the logits: the sampler runs as always

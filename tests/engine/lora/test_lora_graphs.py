"""Adapter decode graphs on the static-buffer path (`capture=False`: the graphs' buffers and
padding, replayed eagerly, as tests/engine/test_decode_graphs.py does for the plain graphs):
decode steps with adapter rows replay the adapter graphs and give peft's merged model's tokens,
base rows and padding rows untouched, base-only steps keep the plain graphs, and an adapter
loaded into a slot after the capture is what the next replay reads."""

import pytest

from kvdeck import LLM, SamplingParams
from tests.engine.lora.conftest import MAX_NEW, PROMPTS
from tests.lora_factory import merged_greedy

pytestmark = pytest.mark.usefixtures("no_decoder_stack")

GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
ENGINE = dict(enable_lora=True, max_num_batched_tokens=16, num_gpu_blocks_override=64, max_model_len=128,
              max_num_seqs=8)


def _with_recorded_graphs(llm: LLM) -> tuple[list, list]:
    """Capture (eagerly) and record which plain and adapter graphs replay: (plain, lora), the
    adapter graphs' with each row's slot and the grouped kernels' tiles (None: per-row)."""
    runner = llm.engine.core.runner
    runner.capture_decode_graphs(llm.engine.core.max_model_len, capture=False)
    graphs = runner.decode_graphs
    assert graphs is not None and graphs.lora is not None  # the self-check passed, both sets
    plain, lora = [], []
    for size, replay in list(graphs.replays.items()):
        graphs.replays[size] = (lambda s=size, r=replay: (plain.append(s), r())[1])
    for key, replay in list(graphs.lora_replays.items()):
        graphs.lora_replays[key] = (
            lambda k=key, r=replay: (lora.append((k, graphs.lora.token_slots.tolist(), _tiles(graphs.lora))),
                                     r())[1])
    return plain, lora


def _tiles(inputs) -> list | None:
    from kvdeck.kernels.reference.lora_tiles import tiles_of

    return None if inputs.packed_tiles is None else tiles_of(inputs.packed_tiles.numpy(), inputs.num_tiles)


def _tokens(outputs) -> list[list[int]]:
    return [list(out.outputs[0].token_ids) for out in outputs]


@pytest.mark.parametrize("backend", ["torch", "triton", "triton_grouped"])
def test_adapter_rows_replay_the_adapter_graphs(lora_llama, backend, monkeypatch):
    """The base and two adapters (ranks 8 and 4, under max_lora_rank 16) in one batch of 3
    rows, padded to the 4-row bucket; the torch reference's every-slot form, or the Triton
    pair (interpreted, so shorter prompts) at the captured rank reading each slot's rank, per
    row or grouped (the graphs' tile buffer: the step's two tiles of one row each)."""
    from kvdeck.kernels.triton import lora_plan

    if backend == "triton_grouped":
        grouped = lora_plan.LoRAKernelConfig(split_k=16, grouped=True)
        monkeypatch.setattr(lora_plan, "_CHOSEN", {None: grouped})
        backend = "triton"
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    if backend == "torch":
        prompts, params = PROMPTS, GREEDY
        expected = [setup.expected("sql", 0), setup.expected(None, 1), setup.expected("code", 2)]
    else:
        prompts = [p[-6:] for p in PROMPTS]
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        expected = [merged_greedy(setup.model_dir, path, [prompt], 4)[0]
                    for path, prompt in zip([setup.adapters["sql"], None, setup.adapters["code"]], prompts)]
    with LLM(str(setup.model_dir), attention_backend=backend, max_lora_rank=16, **ENGINE) as llm:
        plain, lora = _with_recorded_graphs(llm)
        got = _tokens(llm.generate(prompts, params, lora_request=[sql, None, code]))
        assert got == expected
        # Decode steps of the three went through the 4-row adapter graph: the base row and
        # the padding row at slot -1.
        manager = llm.engine.core.runner.lora
        full = [(s[:4], tiles) for (size, _), s, tiles in lora if size == 4]
        sql_slot, code_slot = manager.slot_of[1], manager.slot_of[2]
        grouped = sorted([(sql_slot, [0]), (code_slot, [2])]) if manager.tile_rows else None
        assert ([sql_slot, -1, code_slot, -1], grouped) in full  # tiles: rows 0 and 2, one each
        assert manager.slot_ranks.tolist()[:2] in ([8, 4], [4, 8])
        if manager.tile_rows:  # 8 rows over max_loras 4 slots take at most 4 tiles of 16
            assert llm.engine.core.runner.decode_graphs.lora.num_tiles == 4
        lora.clear()
        plain.clear()
        assert _tokens(llm.generate(prompts[1:2], params)) == expected[1:2]
        assert plain and not lora  # a base-only step keeps the plain graphs


def test_slot_reloaded_after_capture_is_seen_by_the_replay(lora_llama):
    """max_loras=1: sql, then code, then sql again take slot 0 in turn, each loaded after the
    graphs were captured; every decode replays the same adapter graphs."""
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    with LLM(str(setup.model_dir), max_loras=1, **ENGINE) as llm:
        _, lora = _with_recorded_graphs(llm)
        order = [(sql, 1), (code, 2), (sql, 0)]
        for adapter, prompt in order:
            got = _tokens(llm.generate([PROMPTS[prompt]], GREEDY, lora_request=adapter))
            assert got == [setup.expected(adapter.lora_name, prompt)]
            assert lora and all(s[0] == 0 for _, s, _ in lora)  # slot 0, replayed
            lora.clear()


def test_speculative_verify_chunks_replay_the_adapter_graphs(lora_llama):
    """Verify chunks are k + 1 decode rows under the request's adapter: decode-only
    speculative steps replay the adapter graphs (sized for them) with every row's slot."""
    setup = lora_llama
    sql, code = setup.requests["sql"], setup.requests["code"]
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    with LLM(str(setup.model_dir), speculative_config=config, **{**ENGINE, "max_num_seqs": 4}) as llm:
        core = llm.engine.core
        core.runner.capture_decode_graphs(core.max_model_len, capture=False, max_rows=16)
        graphs = core.runner.decode_graphs
        assert graphs is not None and graphs.lora_replays and graphs.max_batch_size == 16
        rows: list[int] = []
        run = graphs.run
        graphs.run = lambda ids, pos, meta, lora_slots=None: (
            rows.append(ids.shape[0]) if lora_slots is not None else None, run(ids, pos, meta, lora_slots))[1]
        got = _tokens(llm.generate(PROMPTS, GREEDY, lora_request=[code, None, sql]))
        assert got == [setup.expected("code", 0), setup.expected(None, 1), setup.expected("sql", 2)]
        assert rows and max(rows) > len(PROMPTS)  # verify chunks replayed on the adapter graphs
        assert llm.stats().spec.num_draft_tokens > 0

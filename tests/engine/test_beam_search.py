"""LLM.beam_search: vLLM's algorithm over one-token requests, equal to transformers' beam search
where the two coincide (no EOS), with its beams sharing their prefix blocks in the cache."""

import math

import pytest
import torch

from kvdeck import LLM, BeamSearchParams
from kvdeck.tui.block_cells import SHARED, classify_blocks

PROMPTS = [
    "The quick brown fox",
    "Paged attention stores keys and values in fixed-size blocks. Continuous batching",
    "def add(a, b):\n    return a + b\n" * 2,
]
# (beam_width, max_tokens, length_penalty, HF early_stopping): without EOS, early_stopping
# and the length normalisation change no ranking, so each case must match exactly.
CASES = [(3, 6, 1.0, False), (4, 5, 0.0, True), (2, 8, 2.0, "never")]


def _engine(path, **config) -> LLM:
    # float32 as transformers runs: beams ranked on close sums must see the same logprobs.
    return LLM(str(path), dtype="float32", kv_cache_memory_gib=0.01, max_model_len=256, **config)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    return {family: _engine(tiny_model_dirs[family]) for family in ("llama", "qwen2")}


def hf_beam_search(model_dir, ids: list[int], width: int, max_new: int, length_penalty: float,
                   early_stopping) -> tuple[list[list[int]], list[float]]:
    """transformers' beam search in float32, EOS off: the generated ids and scores, best first."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             num_beams=width, num_return_sequences=width, do_sample=False,
                             max_new_tokens=max_new, length_penalty=length_penalty,
                             early_stopping=early_stopping, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    return out.sequences[:, len(ids):].tolist(), out.sequences_scores.tolist()


def _idle(llm) -> bool:
    stats = llm.stats()
    return stats.num_running == stats.num_waiting == 0 and sum(stats.block_ref_counts) == 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(("width", "max_new", "length_penalty", "early_stopping"), CASES)
def test_matches_transformers_without_eos(engines, tiny_model_dirs, family, width, max_new,
                                          length_penalty, early_stopping):
    llm = engines[family]
    params = BeamSearchParams(beam_width=width, max_tokens=max_new, ignore_eos=True,
                              length_penalty=length_penalty)
    outputs = llm.beam_search(PROMPTS, params)
    assert _idle(llm)
    tokenizer = llm.get_tokenizer()
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer.encode(prompt)
        expected, scores = hf_beam_search(tiny_model_dirs[family], ids, width, max_new,
                                          length_penalty, early_stopping)
        assert len(output.sequences) == width
        assert [s.tokens[len(ids):] for s in output.sequences] == expected  # token for token, in order
        for seq, score in zip(output.sequences, scores):
            assert seq.tokens[: len(ids)] == ids  # vLLM's tokens start with the prompt
            assert seq.finish_reason == "length" and len(seq.logprobs) == max_new
            # transformers divides by the generated length, vLLM by the whole sequence's.
            assert seq.cum_logprob == pytest.approx(score * max_new ** length_penalty, abs=1e-3)
            chosen = sum(step[t].logprob for step, t in zip(seq.logprobs, seq.tokens[len(ids):]))
            assert seq.cum_logprob == pytest.approx(chosen, abs=1e-5)
            assert seq.text == tokenizer.decode(seq.tokens)


def test_beams_share_their_prompt_blocks(tiny_model_dirs, monkeypatch):
    """During a step, the beams of one prompt hold the same prompt blocks: reference counts
    of beam_width, drawn as shared in the block map; the prefix cache counts the hits."""
    # Synchronous steps (as on the CPU anyway): each step runs through runner.execute.
    llm = _engine(tiny_model_dirs["llama"], async_scheduling=False)
    core = llm.engine.core
    snapshots = []
    execute = core.runner.execute

    def execute_and_look(*args, **kwargs):
        result = execute(*args, **kwargs)
        # What the dashboard reads, the step run and its requests not yet finished.
        snapshots.append(core.stats())
        return result

    monkeypatch.setattr(core.runner, "execute", execute_and_look)
    prompt = llm.get_tokenizer().encode(PROMPTS[1] * 2)
    width = 4
    hits_before = llm.stats().prefix_cache_hits
    llm.beam_search({"prompt_token_ids": prompt}, BeamSearchParams(beam_width=width, max_tokens=4))
    num_prompt_blocks = len(prompt) // core.block_manager.block_size
    assert num_prompt_blocks >= 2
    shared_steps = 0
    for stats in snapshots:
        if len(stats.requests) < 2:
            continue  # the first step: the prompt alone
        prefixes = {tuple(r.block_table[:num_prompt_blocks]) for r in stats.requests}
        assert len(prefixes) == 1  # every beam's table starts with the same physical blocks
        cells = classify_blocks(stats)
        for block in prefixes.pop():
            assert stats.block_ref_counts[block] == len(stats.requests)
            assert cells.kinds[block] == SHARED
        shared_steps += 1
    assert shared_steps == 3 and all(len(s.requests) == width for s in snapshots[1:])
    # Steps 2..4: each of the width beams found at least the prompt's full blocks cached.
    hits = llm.stats().prefix_cache_hits - hits_before
    assert hits >= 3 * width * num_prompt_blocks * core.block_manager.block_size
    assert _idle(llm)
    llm.shutdown()


def test_prefix_caching_off_gives_the_same_beams(tiny_model_dirs, engines):
    params = BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True)
    expected = [[s.tokens for s in o.sequences] for o in engines["qwen2"].beam_search(PROMPTS, params)]
    with _engine(tiny_model_dirs["qwen2"], enable_prefix_caching=False) as llm:
        got = [[s.tokens for s in o.sequences] for o in llm.beam_search(PROMPTS, params)]
        assert llm.stats().prefix_cache_hits == 0
    assert got == expected


def test_eos_ends_a_beam(engines, monkeypatch):
    """A candidate that is an EOS id is set aside as finished ("stop"): no live beam carries
    it, and it competes at the end by its length-penalised score."""
    llm = engines["llama"]
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    free = llm.beam_search(ids, BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=True))
    eos = free[0].sequences[0].tokens[len(ids) + 1]  # the best beam's second token
    monkeypatch.setattr(type(llm.engine), "eos_token_ids", property(lambda engine: [eos]))
    (out,) = llm.beam_search(ids, BeamSearchParams(beam_width=3, max_tokens=4, length_penalty=0.0))
    stopped = [s for s in out.sequences if s.finish_reason == "stop"]
    assert stopped and all(s.tokens[-1] == eos == s.stop_reason for s in stopped)
    assert all(eos not in s.tokens[len(ids):-1] for s in out.sequences)
    assert all(s.finish_reason == "length" and len(s.tokens) == len(ids) + 4
               for s in out.sequences if s not in stopped)
    # length_penalty 0: ranked by the cumulative logprob alone, best first.
    assert [s.cum_logprob for s in out.sequences] == sorted((s.cum_logprob for s in out.sequences),
                                                            reverse=True)


def test_length_penalty_ranks_finished_beams(engines, monkeypatch):
    """vLLM's score: cum_logprob / len ** length_penalty, len counting the prompt, not the EOS."""
    llm = engines["llama"]
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    free = llm.beam_search(ids, BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True))
    eos = free[0].sequences[0].tokens[len(ids)]
    monkeypatch.setattr(type(llm.engine), "eos_token_ids", property(lambda engine: [eos]))
    for penalty in (0.0, 1.0, 3.0):
        (out,) = llm.beam_search(ids, BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=penalty))
        scores = [s.cum_logprob / (len(s.tokens) - (s.tokens[-1] == eos)) ** penalty for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
        if penalty == 0.0:  # the most likely first token, finished: no longer beam beats it
            assert out.sequences[0].tokens == ids + [eos] and out.sequences[0].finish_reason == "stop"


def test_a_beam_at_max_model_len_ends_there(tiny_model_dirs):
    with _engine(tiny_model_dirs["llama"]) as llm:
        ids = list(range(10, 10 + 250))
        (out,) = llm.beam_search(ids, BeamSearchParams(beam_width=2, max_tokens=20, ignore_eos=True))
        assert all(len(s.tokens) == 256 and s.finish_reason == "length" for s in out.sequences)
        assert _idle(llm)


def test_concurrency_limit_gives_the_same_result(engines):
    llm = engines["qwen2"]
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    together = [[s.tokens for s in o.sequences] for o in llm.beam_search(PROMPTS, params)]
    one_by_one = llm.beam_search(PROMPTS, params, concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in one_by_one] == together


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beam_width": 0, "max_tokens": 4}, r"beam_width must be in \[1, 10\]"),
        ({"beam_width": 11, "max_tokens": 4}, r"beam_width must be in \[1, 10\]"),
        ({"beam_width": 2.0, "max_tokens": 4}, "beam_width must be an integer"),
        ({"beam_width": 2, "max_tokens": 0}, "max_tokens must be >= 1"),
        ({"beam_width": 2, "max_tokens": True}, "max_tokens must be an integer"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": "1"}, "length_penalty must be a finite number"),
        ({"beam_width": 2, "max_tokens": 4, "length_penalty": math.nan}, "length_penalty must be a finite"),
        ({"beam_width": 2, "max_tokens": 4, "temperature": -1.0}, "temperature must be >= 0"),
        ({"beam_width": 2, "max_tokens": 4, "ignore_eos": 1}, "ignore_eos must be a bool"),
    ],
)
def test_bad_params(fields, message):
    with pytest.raises(ValueError, match=message):
        BeamSearchParams(**fields)


def test_bad_calls_queue_nothing(engines):
    llm = engines["llama"]
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    with pytest.raises(ValueError, match="params must be a BeamSearchParams"):
        llm.beam_search("hi", {"beam_width": 2})
    with pytest.raises(ValueError, match="concurrency_limit must be a positive integer"):
        llm.beam_search("hi", params, concurrency_limit=0)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.beam_search(["hi", [5] * 256], params)
    with pytest.raises(ValueError, match="non-empty"):
        llm.beam_search([], params)
    assert _idle(llm)


def test_a_step_without_an_engine():
    """advance(): a beam whose request failed (None) is dropped, EOS candidates are set aside
    whatever their rank, the best beam_width of the others live on; finish() ranks all."""
    from kvdeck.engine.api.beam_search import BeamRanking, BeamSearchInstance, advance, finish
    from kvdeck.engine.types.beam_search import BeamSearchSequence
    from kvdeck.engine.types.outputs import Logprob

    def step(**logprobs):
        return {int(t[1:]): Logprob(int(t[1:]), v) for t, v in logprobs.items()}

    ranking = BeamRanking(frozenset({2}), ignore_eos=False, length_penalty=1.0)
    instance = BeamSearchInstance([BeamSearchSequence([9], cum_logprob=-1.0),
                                   BeamSearchSequence([8], cum_logprob=-0.5),
                                   BeamSearchSequence([7], cum_logprob=-0.1)])
    advance(instance, [step(t5=-0.2, t6=-0.3, t2=-4.0), step(t5=-1.0), None], 2, ranking)
    assert [b.tokens for b in instance.beams] == [[9, 5], [9, 6]]  # -1.2, -1.3 beat -1.5
    assert [(b.tokens, b.finish_reason, b.stop_reason) for b in instance.completed] == [([9, 2], "stop", 2)]
    assert instance.beams[0].logprobs[0][6].logprob == -0.3  # the step's candidates are kept
    # The finished beam scores -5.0 / 1 (its EOS not counted), the live ones -1.2 / 2, -1.3 / 2.
    output = finish(instance, 3, ranking, decode=lambda ids: " ".join(map(str, ids)))
    assert [(s.text, s.finish_reason) for s in output.sequences] == [("9 5", "length"), ("9 6", "length"),
                                                                      ("9 2", "stop")]
    ignoring = BeamRanking(frozenset({2}), ignore_eos=True, length_penalty=1.0)
    instance = BeamSearchInstance([BeamSearchSequence([9])])
    advance(instance, [step(t2=-0.1, t5=-0.2)], 2, ignoring)
    assert [b.tokens for b in instance.beams] == [[9, 2], [9, 5]] and not instance.completed

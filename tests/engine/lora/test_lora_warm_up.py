"""The start-up warm-up with LoRA on the Triton path (TRITON_INTERPRET=1 on CPU, set in
tests/conftest.py; the interpreter's counter works out each launch's variant as Triton would)."""

from kvdeck import LLM, SamplingParams
from tests.kernel_launches import LaunchRecorder


def test_the_warm_up_compiles_the_lora_kernels(lora_llama):
    """With LoRA on, the warm-up also runs the shrink/expand pair under each rank class:
    adapters of other ranks, alone or mixed with the base, then compile nothing (and give
    the CPU path's tokens)."""
    from kvdeck.engine.runner.lora.warm_up import warm_up_ranks
    from kvdeck.kernels.compile_counter import kernel_compiles

    setup = lora_llama
    llm = LLM(str(setup.model_dir), attention_backend="triton", kv_cache_memory_gib=0.01, enable_lora=True,
              max_loras=2, max_lora_rank=8, max_num_batched_tokens=32, max_model_len=128)
    runner = llm.engine.core.runner
    assert warm_up_ranks(8, [3, 1, 2]) == [1, 2, 3, 5, 8]
    runner.warm_up(llm.engine.max_model_len)
    before = kernel_compiles()
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    sql, code = setup.requests["sql"], setup.requests["code"]  # ranks 8 and 4
    prompts = [[(7 * i + j) % 200 + 5 for j in range(6 + i)] for i in range(3)]
    batches = ([sql, None, code], [code, code, code], [None, sql, None])
    got = [[o.outputs[0].token_ids for o in llm.generate(prompts, params, lora_request=loras)]
           for loras in batches]
    assert kernel_compiles() == before
    assert got[0][0] != got[2][0] and got[0][2] != got[2][2]  # the adapters change the tokens
    assert runner.lora.warm_up() == 0  # once
    llm.shutdown()
    with LLM(str(setup.model_dir), attention_backend="torch", kv_cache_memory_gib=0.01, enable_lora=True,
             max_loras=2, max_lora_rank=8, max_model_len=128) as cpu:
        assert runner.lora.warm_up() == 0 and cpu.engine.core.runner.lora.warm_up() == 0  # torch: none
        assert got == [[o.outputs[0].token_ids for o in cpu.generate(prompts, params, lora_request=loras)]
                       for loras in batches]


def test_the_warm_up_covers_a_shrink_split_into_chunks(lora_llama, monkeypatch):
    """With the shrink splitting K into chunks (16 inputs each: 4 chunks of the tiny model's 64,
    more of its MLP's), the h strides take the splits too: the warm-up's rank classes follow,
    and serving after it compiles nothing, with the unsplit launch's tokens; the grouped
    kernels (tiles of one adapter's rows, split or fused) too."""
    from kvdeck.kernels.compile_counter import kernel_compiles
    from kvdeck.kernels.triton import lora_plan

    setup = lora_llama
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    prompts = [[(5 * i + j) % 200 + 5 for j in range(5 + i)] for i in range(3)]
    sql, code = setup.requests["sql"], setup.requests["code"]  # ranks 8 and 4 (4 x 4 chunks: 16)
    batches = ([sql, None, code], [code, None, code])
    got = {}
    configs = {0: lora_plan.LoRAKernelConfig(split_k=0, block_n=16),
               16: lora_plan.LoRAKernelConfig(split_k=16, block_n=16),
               "grouped": lora_plan.LoRAKernelConfig(split_k=16, block_n=16, grouped=True),
               "grouped_fused": lora_plan.LoRAKernelConfig(block_n=32, fused=True, grouped=True)}
    for key, config in configs.items():
        monkeypatch.setattr(lora_plan, "_CHOSEN", {None: config})
        with LLM(str(setup.model_dir), attention_backend="triton", kv_cache_memory_gib=0.01, enable_lora=True,
                 max_loras=2, max_lora_rank=8, max_num_batched_tokens=32, max_model_len=128) as llm:
            runner = llm.engine.core.runner
            runner.warm_up(llm.engine.max_model_len)
            before = kernel_compiles()
            outputs = [llm.generate(prompts, params, lora_request=loras) for loras in batches]
            got[key] = [[o.outputs[0].token_ids for o in batch] for batch in outputs]
            assert kernel_compiles() == before, key
            assert bool(runner.lora.tile_rows) == config.grouped
    assert got[16] == got["grouped"] == got["grouped_fused"] == got[0]


def test_lora_launches_a_step_takes_per_launch_form(lora_llama, monkeypatch):
    """What each launch form costs a step in launches: the two-launch forms (per row and
    grouped) a shrink and an expand per adapter-carrying linear, the grouped fused form one;
    a step of base rows only, none (the tiny Llama: 2 layers x 4 fused linears)."""
    from kvdeck.kernels.triton import launch as launch_module
    from kvdeck.kernels.triton import lora_plan

    setup = lora_llama
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    prompt = [[7, 9, 11, 13, 15, 17]]
    forms = {"per_row": (lora_plan.LoRAKernelConfig(split_k=16), 16),
             "grouped": (lora_plan.LoRAKernelConfig(split_k=16, grouped=True), 16),
             "grouped_fused": (lora_plan.LoRAKernelConfig(fused=True, grouped=True), 8)}
    for name, (config, expected) in forms.items():
        monkeypatch.setattr(lora_plan, "_CHOSEN", {None: config})
        with LLM(str(setup.model_dir), attention_backend="triton", kv_cache_memory_gib=0.01, enable_lora=True,
                 max_loras=2, max_lora_rank=8, max_model_len=128) as llm:
            llm.generate(prompt, params, lora_request=setup.requests["sql"])  # the variants compile
            recorder = LaunchRecorder(launch_module.COMPILES)
            monkeypatch.setattr(launch_module, "COMPILES", recorder)
            llm.generate(prompt, params, lora_request=setup.requests["sql"])  # one prefill step
            assert len(recorder.lora()) == expected, (name, recorder.lora())
            recorder.kernels.clear()
            llm.generate(prompt, params)
            assert not recorder.lora(), name
            monkeypatch.setattr(launch_module, "COMPILES", recorder.counter)


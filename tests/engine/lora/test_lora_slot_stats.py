"""The stats snapshot's LoRA slots: which adapter sits in which slot (and its rank), the host
copies held, through the JSON form the stats stream sends; None with LoRA off."""

from kvdeck import LLM, SamplingParams
from kvdeck.engine.types.stats import stats_from_dict, stats_to_dict
from tests.engine.lora.conftest import PROMPTS

ENGINE = dict(num_gpu_blocks_override=64, max_model_len=128)


def test_stats_name_each_slots_adapter(lora_llama):
    setup = lora_llama
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with LLM(str(setup.model_dir), enable_lora=True, max_loras=3, max_cpu_loras=5, **ENGINE) as llm:
        empty = llm.stats().lora
        assert empty.slot_adapters == [None] * 3 and empty.host_adapters == 0 and empty.max_cpu_loras == 5
        llm.generate([PROMPTS[0], PROMPTS[1]], params,
                     lora_request=[setup.requests["code"], setup.requests["sql"]])
        slots = stats_from_dict(stats_to_dict(llm.stats())).lora
        assert sorted(zip(slots.slot_adapters, slots.slot_ranks), key=str) == [
            ("code", 4), ("sql", 8), (None, 0)]
        assert slots.host_adapters == 2
        llm.engine.core.runner.lora.remove(setup.requests["sql"].lora_int_id)
        after = llm.stats().lora
        assert "sql" not in after.slot_adapters and after.host_adapters == 1
    with LLM(str(setup.model_dir), **ENGINE) as plain:
        assert plain.stats().lora is None

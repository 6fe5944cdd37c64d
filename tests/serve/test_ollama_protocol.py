"""Ollama's options to the engine's sampling params, and its messages to the chat
template's, without a server."""

import json

import pytest

from kvdeck.app.serve.errors import OpenAIError
from kvdeck.app.serve.ollama_models import tagged_name
from kvdeck.app.serve.ollama_protocol import (
    OllamaMessage,
    OllamaOptions,
    OllamaShowRequest,
    format_spec,
)


def test_options_reach_the_sampler_under_the_engines_names():
    params = OllamaOptions(temperature=0.3, top_p=0.9, top_k=40, min_p=0.05, seed=7, num_predict=12,
                           stop=["\n"], repeat_penalty=1.1, presence_penalty=0.5,
                           frequency_penalty=-0.5).sampling_params(None)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed) == \
        (0.3, 0.9, 40, 0.05, 7)
    assert params.max_tokens == 12 and params.stop == ["\n"] and params.repetition_penalty == 1.1
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)


def test_ollamas_special_values_and_ignored_options():
    options = OllamaOptions(seed=-1, num_predict=-1, num_ctx=8192, num_thread=4, use_mmap=True,
                            repeat_last_n=64, typical_p=1.0, mirostat=0)
    params = options.sampling_params(None)
    assert params.seed is None and params.max_tokens is None  # random; to the context's end
    assert OllamaOptions(num_predict=-2, stop="x").sampling_params(None).stop == ["x"]


@pytest.mark.parametrize(("options", "param"), [
    ({"num_predict": 0}, "options.num_predict"),
    ({"mirostat": 2}, "options.mirostat"),
    ({"typical_p": 0.5}, "options.typical_p"),
])
def test_bad_options_name_the_option(options, param):
    with pytest.raises(OpenAIError) as caught:
        OllamaOptions(**options).sampling_params(None)
    assert caught.value.status == 400 and caught.value.param == param
    assert param in caught.value.message


def test_format_and_messages():
    assert format_spec("") is None and format_spec("json").json_object
    assert json.loads(format_spec({"type": "object"}).json) == {"type": "object"}
    message = OllamaMessage(role="assistant", content="", tool_calls=[
        {"function": {"name": "f", "arguments": {"x": 1}}}])
    (call,) = message.for_template(3)["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'} and call["type"] == "function"
    assert OllamaMessage(role="tool", content="21", tool_name="f").for_template(4)["name"] == "f"


def test_show_takes_model_or_older_clients_name():
    assert OllamaShowRequest.model_validate({"model": "m"}).model == "m"
    assert OllamaShowRequest.model_validate({"name": "m"}).model == "m"


def test_tagged_names():
    assert tagged_name("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct:latest"
    assert tagged_name("m:q4") == "m:q4" and tagged_name("org/m") == "org/m:latest"

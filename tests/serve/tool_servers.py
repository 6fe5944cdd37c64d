"""The demo model with a chat template that renders tools (Hermes/Qwen style), served for
the API tests (structured outputs, the Responses and Messages APIs), and reading a stream
of typed Server-Sent Events (`event:` lines, as both of those APIs send)."""

import json
import shutil
from pathlib import Path

import httpx

from kvdeck.engine.types.model_path import demo_model_dir

TOOLS_TEMPLATE = """{%- if tools %}<|system|>
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}
{% endif %}You may call functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Answer with <tool_call>
{"name": <name>, "arguments": <arguments>}
</tool_call>{{ eos_token }}
{%- elif messages[0]['role'] == 'system' %}<|system|>
{{ messages[0]['content'] }}{{ eos_token }}
{%- endif %}
{%- for message in messages %}
{%- if message['role'] == 'user' %}<|user|>
{{ message['content'] }}{{ eos_token }}
{%- elif message['role'] == 'assistant' %}<|assistant|>
{% if message['content'] %}{{ message['content'] }}{% endif %}
{%- for call in message['tool_calls'] or [] %}<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] }}}
</tool_call>{% endfor %}{{ eos_token }}
{%- elif message['role'] == 'tool' %}<|user|>
<tool_response>
{{ message['content'] }}
</tool_response>{{ eos_token }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>
{% endif %}"""


def demo_with_tools_template(root: Path) -> Path:
    """A copy of the demo model whose chat template renders tools."""
    model = root / "demo-tools"
    shutil.copytree(demo_model_dir(), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOLS_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def typed_events(url: str, body: dict) -> list[dict]:
    """POST `body`, read the stream: each event's `event:` name must be its data's type."""
    with httpx.stream("POST", url, timeout=60, json=body) as response:
        assert response.status_code == 200, response.read()
        events, name = [], None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                events.append(data)
    return events

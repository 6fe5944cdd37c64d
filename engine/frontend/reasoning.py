"""A thinking model's reasoning apart from its answer: `<think> ... </think>` (vLLM's
reasoning parsers `qwen3` and `deepseek_r1`).

`qwen3`: the model opens the block itself; a reply that does not start with `<think>` (the
template's `enable_thinking=False`, or a model that did not think) is all answer.
`deepseek_r1`: the chat template opens the block in the prompt, so the reply starts inside
it (a `<think>` it writes anyway is dropped) and a reply without `</think>` is all reasoning.

`split_reasoning` is prefix-stable while a reply grows: text that may still turn out to be
a tag (or whitespace around the parts, which are trimmed) is held back until it is known,
so a stream sends each part's new text as it comes and never takes any back.
"""

from dataclasses import dataclass

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(slots=True, frozen=True)
class ReasoningFormat:
    name: str
    starts_inside: bool  # the prompt opened the block (deepseek_r1)
    start: str = THINK_START
    end: str = THINK_END


REASONING_FORMATS = {
    "qwen3": ReasoningFormat("qwen3", starts_inside=False),
    "deepseek_r1": ReasoningFormat("deepseek_r1", starts_inside=True),
}


def reasoning_format(name: str) -> ReasoningFormat:
    try:
        return REASONING_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; kvdeck has "
                         f"{', '.join(REASONING_FORMATS)}") from None


def split_reasoning(fmt: ReasoningFormat | None, text: str, finished: bool) -> tuple[str, str]:
    """(reasoning, answer) of a reply so far; `finished`: nothing more will come, so nothing
    is held back. No format: all answer (a model served without a parser)."""
    if fmt is None:
        return "", text
    stripped = text.lstrip()
    if stripped.startswith(fmt.start):
        inside, body = True, stripped[len(fmt.start):]
    elif not finished and fmt.start.startswith(stripped):
        return "", ""  # empty, or the start of a tag: not known yet
    else:
        inside, body = fmt.starts_inside, text
    if not inside:
        return "", text
    closed = body.find(fmt.end)
    if closed < 0:
        if finished:
            return body.strip(), ""
        return _held_back(body.lstrip(), fmt.end).rstrip(), ""
    answer = body[closed + len(fmt.end):]
    return body[:closed].strip(), answer.lstrip() if answer.strip() else ""


def _held_back(text: str, tag: str) -> str:
    """`text` without an ending that may be the start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return text[:-size]
    return text


@dataclass(slots=True)
class ReasoningStream:
    """One streamed reply: each update gives the reasoning's new text, the answer's new text
    and the answer so far (what a tool-call parser reads). No format: the reply as it comes."""

    fmt: ReasoningFormat | None
    reasoning_sent: int = 0
    answer_sent: int = 0

    def update(self, text: str, finished: bool) -> tuple[str, str, str]:
        reasoning, answer = split_reasoning(self.fmt, text, finished)
        new_reasoning, new_answer = reasoning[self.reasoning_sent:], answer[self.answer_sent:]
        self.reasoning_sent, self.answer_sent = len(reasoning), len(answer)
        return new_reasoning, new_answer, answer


def detect_reasoning_format(tokenizer) -> ReasoningFormat | None:
    """The format a model's chat template implies: a template that opens `<think>` in the
    prompt it renders for a reply is deepseek_r1's, one that only mentions the tag (Qwen3's
    `enable_thinking` switch) qwen3's; None for a template with no `<think>` (the TUI's
    choice; the server takes --reasoning-parser, as vLLM does)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or THINK_START not in template:
        return None
    try:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": "?"}],
                                               add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this: no reply to read
        return None
    opened = isinstance(prompt, str) and prompt.rstrip().endswith(THINK_START)
    return REASONING_FORMATS["deepseek_r1" if opened else "qwen3"]

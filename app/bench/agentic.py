"""An agent-like workload: a coding agent's transcript of JSON tool calls, their results and
code edits, the same few actions over and over with other files, symbols and numbers.

What suffix decoding is for: the next call repeats most of the calls before it (in the
prompt: what n-gram lookup also finds) and of other requests' outputs (what only the global
suffix tree holds). Every prompt is a different transcript from a seeded generator, so the
workload is the same on every run; each ends where the agent writes its next call.
"""

import json
import random

HEADER = ("You are a coding agent. Reply with one tool call per line as JSON, "
          '{"tool": ..., "args": {...}}; each result follows as a RESULT line.\n\n')
FILES = ("src/server/routes.py", "src/server/auth.py", "src/engine/cache.py", "src/engine/scheduler.py",
         "src/cli/main.py", "tests/test_routes.py", "tests/test_cache.py", "docs/usage.md")
SYMBOLS = ("handle_request", "load_config", "evict_blocks", "schedule_step", "parse_args",
           "check_token", "build_index", "flush_metrics")
TYPES = ("int", "str", "bool", "float", "dict[str, int]", "list[str]")
ERRORS = ("TypeError", "KeyError", "ValueError", "AssertionError")


def _edit(rng: random.Random, path: str, symbol: str) -> list[dict]:
    arg, kind = rng.choice(("limit", "name", "strict", "timeout")), rng.choice(TYPES)
    old = f"def {symbol}(self, request):"
    new = f"def {symbol}(self, request, {arg}: {kind} = None):"
    return [{"tool": "edit_file", "args": {"path": path, "old": old, "new": new}},
            {"result": {"ok": True, "path": path, "lines_changed": rng.randint(1, 4)}}]


def _step(rng: random.Random) -> list[dict]:
    """One action of the agent and what came back: call, result."""
    path, symbol = rng.choice(FILES), rng.choice(SYMBOLS)
    action = rng.randrange(5)
    if action == 0:
        start = rng.randrange(1, 400, 10)
        return [{"tool": "read_file", "args": {"path": path, "start_line": start, "end_line": start + 40}},
                {"result": {"ok": True, "path": path, "lines": 40}}]
    if action == 1:
        return [{"tool": "search_code", "args": {"query": symbol, "path": "src/"}},
                {"result": {"ok": True, "matches": [{"path": p, "line": rng.randint(1, 400)}
                                                    for p in rng.sample(FILES, 2)]}}]
    if action == 2:
        failed = rng.randint(0, 2)
        result = {"ok": failed == 0, "passed": rng.randint(10, 60), "failed": failed}
        if failed:
            result["error"] = f"{rng.choice(ERRORS)} in {symbol}"
        return [{"tool": "run_tests", "args": {"path": rng.choice(FILES[5:7]), "verbose": False}},
                {"result": result}]
    return _edit(rng, path, symbol)


def _step_lines(rng: random.Random) -> list[str]:
    return [("RESULT " + json.dumps(entry["result"]) if "result" in entry else json.dumps(entry)) + "\n"
            for entry in _step(rng)]


def agentic_prompts(tokenizer, num: int, input_len: int, seed: int) -> list[list[int]]:
    """`num` prompts of exactly `input_len` tokens: the header, then the end of a transcript
    (ValueError without a tokenizer). Lines are tokenized one at a time (each ends in a
    newline), so no text longer than the model is ever encoded."""
    if tokenizer is None:
        raise ValueError("the agentic workload needs the model's tokenizer (not load_format dummy)")
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    header = tokenizer.encode(HEADER, add_special_tokens=False)
    if input_len < len(bos) + len(header) + 8:
        raise ValueError(f"the agentic workload needs --input-len >= {len(bos) + len(header) + 8}, "
                         f"got {input_len}")
    room = input_len - len(bos) - len(header)
    prompts = []
    for i in range(num):
        rng = random.Random(seed * 1000 + i)
        transcript: list[int] = []
        while len(transcript) < room:  # whole steps: the prompt ends after a result
            for line in _step_lines(rng):
                transcript += tokenizer.encode(line, add_special_tokens=False)
        prompts.append(bos + header + transcript[len(transcript) - room:])
    return prompts

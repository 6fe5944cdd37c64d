"""An ordinary chat workload: single questions a chat user asks, in the model's chat template,
whose answers are the model's own writing (nothing in the prompt to copy). What speculation
must not slow down: a default that turns itself on has to pay nothing here.

Each prompt is one question chosen by the seed; `input_len` is an upper bound (a question
that does not fit is an error naming it), since a question has the length it has.
"""

import random

QUESTIONS = (
    "How does a bicycle stay upright while it moves?",
    "Write a short poem about the sea in winter.",
    "What are three good habits for learning a new language?",
    "Explain what a black hole is to a ten-year-old.",
    "Suggest a simple vegetarian dinner and how to cook it.",
    "Why is the sky blue during the day and red at sunset?",
    "Give me some ideas for a birthday present for my grandmother.",
    "What is the difference between weather and climate?",
    "Tell me a story about a cat who wants to become a sailor.",
    "How can I sleep better at night?",
    "What should I pack for a three-day hiking trip?",
    "Describe how bread rises when it is baked.",
    "What were the main causes of the industrial revolution?",
    "How do I start running if I have never exercised?",
    "Write a friendly email inviting my neighbours to a garden party.",
    "What makes a good story for children?",
)


def chat_prompts(tokenizer, num: int, input_len: int, seed: int) -> list[list[int]]:
    """`num` chat prompts (the template's generation prompt at the end), at most `input_len`
    tokens each; ValueError without a tokenizer or a chat template."""
    if tokenizer is None:
        raise ValueError("the chat workload needs the model's tokenizer (not load_format dummy)")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the chat workload needs a model with a chat template")
    rng = random.Random(seed)
    order = list(QUESTIONS)
    rng.shuffle(order)
    prompts = []
    for i in range(num):
        question = order[i % len(order)]
        ids = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                            add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        if len(ids) > input_len:
            raise ValueError(f"the chat workload's question {question!r} is {len(ids)} tokens, "
                             f"over --input-len {input_len}")
        prompts.append(ids)
    return prompts

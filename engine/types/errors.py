"""The two kinds of bad input a caller may want to tell apart from the rest.

Both are ValueErrors, as every bad-input error of the engine is: a caller that does not
care catches ValueError. The server answers them with different error fields.
"""


class PromptError(ValueError):
    """The prompt or the messages cannot become token ids (bad text, a chat template that
    refuses the messages, far more text than the context can hold)."""


class GrammarError(ValueError):
    """A structured-outputs spec (schema, regex, grammar) that cannot be used, quoting why."""

"""Prompt templates: a problem's question text -> the user message given to the policy.

Templates are plain strings with one `{problem}` placeholder, filled by substitution rather
than `str.format`, so LaTeX braces in a template (`\\boxed{}`) or in the problem need no
escaping. Rendering the user message into the model's chat format is the tokenizer's job
(`da3po_jax.models.tokenizer.Tokenizer.render_prompt`); data/ does not import models/.

Built-in templates:

- `"dapo"`: the DAPO paper's instruction, asking for a final `Answer: ...` line; used by
  the real recipe.
- `"boxed"`: the Qwen2.5-Math style instruction asking for `\\boxed{}`.
- `"tiny"`: the bare question, for the synthetic task. The tiny model learns the answer
  format from its warm-up targets, so an instruction would only cost context.
- `"raw"`: the bare text, for datasets whose prompt already carries an instruction
  (DAPO-Math-17k's user messages contain the DAPO instruction).
"""

from __future__ import annotations

from collections.abc import Mapping

PLACEHOLDER = "{problem}"

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should "
    "be of the form Answer: $Answer (without quotes) where $Answer is the answer to the "
    'problem.\n\n{problem}\n\nRemember to put your answer on its own line after "Answer:".'
)
BOXED_TEMPLATE = (
    "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}."
)

PROMPT_TEMPLATES: Mapping[str, str] = {
    "dapo": DAPO_TEMPLATE,
    "boxed": BOXED_TEMPLATE,
    "tiny": PLACEHOLDER,
    "raw": PLACEHOLDER,
}


def get_template(template: str) -> str:
    """The template string for a built-in name, or `template` itself if it has `{problem}`.

    Raises:
      ValueError: neither a known name nor a string containing `{problem}`.
    """
    if template in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[template]
    if PLACEHOLDER in template:
        return template
    raise ValueError(
        f"unknown prompt template {template!r}: use one of {sorted(PROMPT_TEMPLATES)} "
        f"or a string containing {PLACEHOLDER!r}"
    )


def format_prompt(problem: str, template: str = "dapo") -> str:
    """The user message for `problem` under `template` (a built-in name or a string).

    Args:
      problem: question text (`MathProblem.prompt`).
      template: `"dapo"`, `"boxed"`, `"tiny"`, `"raw"`, or a custom string with one
        `{problem}` placeholder.
    """
    return get_template(template).replace(PLACEHOLDER, problem.strip())

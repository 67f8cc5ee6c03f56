"""Prompts -> token ids: `PromptEncoder` renders and tokenises each problem once (by id)
and left-pads prompts into the run's length buckets."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from da3po_jax.data import MathProblem
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.sampling.host import pick_bucket


class PromptEncoder:
    """Renders and tokenises prompts once per problem id, and pads them into buckets."""

    def __init__(
        self, tokenizer: Tokenizer, render: Callable[[MathProblem], str], buckets: Sequence[int]
    ):
        self.tokenizer = tokenizer
        self.render = render
        self.buckets = tuple(sorted(buckets))
        self._ids: dict[str, list[int]] = {}

    def ids(self, problem: MathProblem) -> list[int]:
        if problem.id not in self._ids:
            self._ids[problem.id] = self.tokenizer.encode([self.render(problem)])[0]
        return self._ids[problem.id]

    def bucket(self, problems: Sequence[MathProblem]) -> int:
        """The padded length (smallest bucket) that fits every prompt of `problems`."""
        return pick_bucket(max(len(self.ids(p)) for p in problems), self.buckets)

    def pad(self, problems: Sequence[MathProblem], length: int | None = None):
        """(tokens, mask) [P, bucket] for `problems`; `length` forces the padded length."""
        ids = [self.ids(p) for p in problems]
        return self.tokenizer.pad_left(ids, length or self.bucket(problems))

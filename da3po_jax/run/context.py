"""What every stage of a run shares: `RunContext` (settings, workdir, tokenizer, prompt
encoder, datasets, reward scorer, mesh, stop request), built in one place for the
training run and the eval command alike (`open_context`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from jax.sharding import Mesh

from da3po_jax.config import Settings
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel.mesh import kernel_mesh
from da3po_jax.rewards import RewardScorer
from da3po_jax.rollout import PromptEncoder
from da3po_jax.run.inputs import Datasets, prompt_renderer, scorer_kwargs
from da3po_jax.runtime.signals import StopRequest


@dataclasses.dataclass
class RunContext:
    """What every stage of a run shares (`open_context` builds it)."""

    settings: Settings
    workdir: str
    tokenizer: Tokenizer
    encoder: PromptEncoder
    data: Datasets
    scorer: RewardScorer
    mesh: Mesh | None = None
    stop: StopRequest | None = None

    def replace(self, **changes) -> RunContext:
        return dataclasses.replace(self, **changes)


@contextlib.contextmanager
def open_context(
    settings: Settings,
    workdir: str,
    tokenizer: Tokenizer,
    data: Datasets,
    mesh: Mesh | None = None,
    encoder: PromptEncoder | None = None,
) -> Iterator[RunContext]:
    """The run's context: prompts rendered with the run's template and tokenised into its
    buckets (by `encoder` when the caller already made it), and the reward worker pool
    (closed on exit). Inside it, on TPU, traces see the mesh, so the Pallas kernels run per
    shard (`parallel.mesh.kernel_mesh`)."""
    encoder = encoder or PromptEncoder(
        tokenizer, prompt_renderer(settings, tokenizer), settings.rollout.buckets
    )
    scorer = RewardScorer(**scorer_kwargs(settings.reward))
    try:
        with kernel_mesh(mesh):
            yield RunContext(settings, workdir, tokenizer, encoder, data, scorer, mesh)
    finally:
        scorer.close()

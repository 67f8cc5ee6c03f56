"""Held-out evaluation: avg@k (mean accuracy over k samples) and pass@k, by tier.

Prompts go through the sampler in fixed-size calls (the last call is padded by repeating
prompts, whose results are dropped) so evaluation compiles once per bucket. The calls
reuse one donated KV cache, freed when evaluation ends (`Sampler.clear`): the sampler may
be the trainer's, and no cache may stay alive through the next update.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from da3po_jax.data import MathProblem
from da3po_jax.rewards import RewardScorer
from da3po_jax.sampling import GenerateConfig, Sampler, prompt_keys
from da3po_jax.train.rollout import PromptEncoder, sample_and_score


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def evaluate(
    params,
    problems: Sequence[MathProblem],
    *,
    sampler: Sampler,
    encoder: PromptEncoder,
    scorer: RewardScorer,
    gen: GenerateConfig,
    prompts_per_call: int,
    rng: jax.Array,
    mesh: Mesh | None = None,
) -> dict[str, float]:
    """avg@k and pass@k over `problems` (k = gen.num_samples), overall and per tier.

    Returns:
      `eval/avg@k`, `eval/pass@k`, `eval/avg@k/<tier>`, `eval/pass@k/<tier>`,
      `eval/response_len`, `eval/truncated_frac`, `eval/num_prompts`.
    """
    k = gen.num_samples
    per_prompt: list[np.ndarray] = []
    lengths, truncated = [], []
    try:
        for start in range(0, len(problems), prompts_per_call):
            chunk = list(problems[start : start + prompts_per_call])
            real = len(chunk)
            chunk += [chunk[i % real] for i in range(prompts_per_call - real)]
            keys = prompt_keys(rng, prompts_per_call, start=start)  # prompt i: fold_in(rng, i)
            _, host = sample_and_score(
                sampler,
                params,
                chunk,
                keys,
                encoder=encoder,
                scorer=scorer,
                gen=gen,
                mesh=mesh,
            )
            per_prompt.extend(host.correct[:real])
            lengths.append(host.lengths[:real])
            truncated.append(host.truncated[:real])
    finally:  # the eval cache is not kept alive past evaluation (what the planner counts)
        sampler.clear()
    acc = np.stack(per_prompt) if per_prompt else np.zeros((0, k))
    tiers = defaultdict(list)
    for p, row in zip(problems, acc):
        tiers[p.tier or "all"].append(row)
    metrics = _summary(acc, k, "")
    for tier, rows in sorted(tiers.items()):
        if tier != "all":
            metrics.update(_summary(np.stack(rows), k, f"/{tier}"))
    metrics["eval/response_len"] = float(np.concatenate(lengths).mean()) if lengths else 0.0
    metrics["eval/truncated_frac"] = float(np.concatenate(truncated).mean()) if lengths else 0.0
    metrics["eval/num_prompts"] = float(len(problems))
    return metrics


def _summary(acc: np.ndarray, k: int, suffix: str) -> dict[str, float]:
    if acc.size == 0:
        return {}
    passes = [pass_at_k(k, int(row.sum()), k) for row in acc]
    return {
        f"eval/avg@{k}{suffix}": float(acc.mean()),
        f"eval/pass@{k}{suffix}": float(np.mean(passes)),
    }


@dataclasses.dataclass
class HeldoutEval:
    """The loop's periodic held-out evaluation: `evaluate` on fixed problems, the RNG
    folded with the step so that a resumed run evaluates exactly as an uninterrupted one."""

    sampler: Sampler
    encoder: PromptEncoder
    scorer: RewardScorer
    gen: GenerateConfig
    problems: list[MathProblem]
    prompts_per_call: int
    seed: int
    mesh: Mesh | None = None

    def __call__(self, params, step: int) -> dict[str, float]:
        if not self.problems:
            return {}
        return evaluate(
            params,
            self.problems,
            sampler=self.sampler,
            encoder=self.encoder,
            scorer=self.scorer,
            gen=self.gen,
            prompts_per_call=min(self.prompts_per_call, len(self.problems)),
            rng=jax.random.fold_in(jax.random.PRNGKey(self.seed + 1), step),
            mesh=self.mesh,
        )

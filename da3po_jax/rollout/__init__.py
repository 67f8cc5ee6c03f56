"""The rollout stage of an RL step: prompts in, scored groups out, one batch per step.

- `batch`: the record every seam carries, `GroupBatch` (built by `from_samples`), and
  what an engine returns, `ScoredGroups`;
- `encoder`: prompts rendered, tokenised and bucketed once;
- `scoring`: the one decode -> score path;
- `protocol`, `engines`: the `RolloutEngine` calls and the registry of engines
  (`static.py`: one sampler call per round; `continuous.py`: continuous batching);
- `collector`: the prompt stream, dynamic sampling as a stream and the state carried
  across steps (`RLCarry`: surplus, DAA prior, history table).
"""

from da3po_jax.rollout.batch import GroupBatch, GroupScores, ScoredGroups
from da3po_jax.rollout.collector import CollectConfig, Collected, Collector, KeepRule, RLCarry
from da3po_jax.rollout.encoder import PromptEncoder
from da3po_jax.rollout.engines import ENGINES, build_engine
from da3po_jax.rollout.protocol import EngineParts, RolloutEngine

__all__ = [
    "ENGINES",
    "CollectConfig",
    "Collected",
    "Collector",
    "EngineParts",
    "GroupBatch",
    "GroupScores",
    "KeepRule",
    "PromptEncoder",
    "RLCarry",
    "RolloutEngine",
    "ScoredGroups",
    "build_engine",
]

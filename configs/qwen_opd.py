"""On-policy distillation: Qwen3-1.7B student, Qwen3-8B teacher (same tokenizer), on the
prompts of DAPO-Math-17k; `--config.algo=ra_opd` adds the reward-aligned filter.

    python -m da3po_jax.main --config=configs/qwen_opd.py \\
        --config.model.path=/data/Qwen3-1.7B --config.teacher.path=/data/Qwen3-8B \\
        --config.data.train_path=/data/dapo-math-17k.parquet \\
        --config.data.eval_path=/data/aime-2024.parquet --workdir=/data/runs/qwen_opd

The per-token advantage is the negative reverse-KL estimate logp_student - logp_teacher of
each sampled token (no discount), trained with the symmetric clipped surrogate and the
token-level loss; the teacher is frozen, sharded like the student and scored in one forward
per step. Rewards are still verified: they give the accuracy metrics, the RA-OPD filter and
(with `opd.with_outcome`) the GRPO outcome term.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen3_math  # noqa: E402


def get_config():
    c = qwen3_math.get_config()
    c.algo = "opd"
    c.model.path = "/path/to/Qwen3-1.7B"  # placeholder: a HF folder of the student
    c.model.preset = "qwen3-1.7b"  # shapes for the planner before the download
    c.teacher.path = ""  # required: a HF folder of Qwen3-8B (the teacher)
    c.teacher.eval = True
    c.opd.coef = 1.0
    c.opd.gamma = 0.0
    c.ra_opd.delta = 0.0
    c.ra_opd.baseline = "none"

    c.rollout.prompts_per_round = 128
    c.rollout.group_size = 8
    c.rl.train_prompts = 128
    c.rl.mini_batch_prompts = 32
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.train.steps = 200
    return c

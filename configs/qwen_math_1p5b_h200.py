"""qwen_math.py sized for Qwen2.5-Math-1.5B on one H200 (141 GiB).

    python -m da3po_jax.main --config=configs/qwen_math_1p5b_h200.py \
        --config.model.path=/data/Qwen2.5-Math-1.5B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/1p5b_h200
    python -m da3po_jax.plan --config=configs/qwen_math_1p5b_h200.py --device=h200 --num_devices=1

Changes from qwen_math.py and why: a 1-device mesh; sequences capped at the model's
4096-token context (prompts <= 1024, responses <= 3072, overlong buffer 512); rollout
rounds of 32 prompts x 16 and eval calls of 16 prompts x 32 samples (KV cache); 128
groups per step in mini-batches of 32, packed micro-batches of 16 rows of 4096 tokens.

Planner (python -m da3po_jax.plan, GiB): params 5.75, optimizer 11.50, grads 11.50, batch
0.10, kv_cache 56.00, rollout_work 2.12, activations 48.31, update_work 2.88; rollout
phase 58.12, train phase 62.68; peak 80.03 GiB = 56.8% of 141 GiB -> fits (usable 90%;
on GPUs set XLA_PYTHON_CLIENT_MEM_FRACTION=.9, JAX preallocates 75% by default).

Compiled for one TPU chip (python -m da3po_jax.plan
--config=configs/qwen_math_1p5b_h200.py --compile=v5p-2; jax 0.10.2, libtpu 0.0.42.1,
2026-12-05), every program ok: compiled peak 80.43 GiB (the sampler), planned 78.53
(-2.4%), but by phase the plan is high on the update (61.18 vs 36.48 GiB) and low on the
rollout (58.02 vs 63.09): docs/memory.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen_math  # noqa: E402


def get_config():
    c = qwen_math.get_config()
    qwen_math.sized(
        c,
        "/path/to/Qwen2.5-Math-1.5B",
        "qwen2.5-math-1.5b",
        mesh=(1, 1, 1),
        prompts_per_round=32,
        eval_prompts=16,
    )
    return c

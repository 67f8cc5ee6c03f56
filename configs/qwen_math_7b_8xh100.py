"""qwen_math.py sized for Qwen2.5-Math-7B on one 8 x H100 (80 GiB) node; fits by the planner.

    python -m da3po_jax.main --config=configs/qwen_math_7b_8xh100.py \
        --config.model.path=/data/Qwen2.5-Math-7B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/7b_h100
    python -m da3po_jax.plan --config=configs/qwen_math_7b_8xh100.py --device=h100 --num_devices=8

Changes from qwen_math.py and why: FSDP over the 8 GPUs (f32 master weights and AdamW
state sharded 8 ways); sequences capped at Qwen2.5-Math-7B's 4096-token context (prompts
<= 1024, responses <= 3072, overlong buffer 512); rollout rounds of 64 prompts x 16 and
eval calls of 32 prompts x 32 samples, because the KV cache of DAPO's 512 x 16 x 20k
tokens is ~1.2 TiB per GPU here; 128 groups per step in mini-batches of 32, packed
micro-batches of 16 rows of 4096 tokens (2 per GPU). configs/qwen_dapo_7b_8xh100.py runs
DAPO's full response length on this node with Qwen2.5-7B.

Planner (python -m da3po_jax.plan, GiB per GPU): params 3.55, optimizer 7.09, grads
7.09, batch 0.01, gathered 2.03, kv_cache 28.00, decode_weights 15.96, rollout_work 1.12,
activations 8.95, update_work 3.80; rollout phase 45.08, train phase 19.85; peak 57.77 GiB
= 72.2% of 80 GiB -> fits (usable 90%; on GPUs set XLA_PYTHON_CLIENT_MEM_FRACTION=.9, JAX
preallocates 75% by default).

Compiled for a TPU of the same chip count (python -m da3po_jax.plan
--config=configs/qwen_math_7b_8xh100.py --compile=v5p-16; jax 0.10.2, libtpu 0.0.42.1,
2026-12-05; a GPU cannot be compiled for without one), every program ok: compiled peak
58.02 GiB per chip (eval_generate), planned 57.75 (-0.5%); rollout phase 47.33 / 45.06,
train phase 19.93 / 21.69 GiB. With the planner's GPU terms (cuDNN's segment mask) the
plan above is 57.77 GiB of 80.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen_math  # noqa: E402


def get_config():
    c = qwen_math.get_config()
    qwen_math.sized(
        c,
        "/path/to/Qwen2.5-Math-7B",
        "qwen2.5-math-7b",
        mesh=(1, 8, 1),
        prompts_per_round=64,
        eval_prompts=32,
    )
    return c

"""qwen_math.py sized for Qwen2.5-Math-7B on a TPU v5p-8 (4 chips x 95 GiB); fits by the planner.

    python -m da3po_jax.main --config=configs/qwen_math_7b_v5p8.py \
        --config.model.path=/data/Qwen2.5-Math-7B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/7b_v5p8
    python -m da3po_jax.plan --config=configs/qwen_math_7b_v5p8.py --device=v5p --num_devices=4

Changes from qwen_math.py and why: FSDP over the 4 chips (f32 master weights and AdamW
state: bf16 weights would round away most lr=1e-6 updates); sequences capped at
Qwen2.5-Math-7B's 4096-token context (prompts <= 1024, responses <= 3072, overlong buffer
512); rollout rounds of 32 prompts x 16 and eval calls of 16 prompts x 32 samples (KV
cache); 128 groups per step in mini-batches of 32, packed micro-batches of 16 rows of 4096
tokens (4 per chip), logits in chunks of 512.

Planner (python -m da3po_jax.plan, GiB per chip): params 7.09, optimizer 14.19, grads
14.19, batch 0.02, gathered 2.03, kv_cache 28.00, decode_weights 17.73, rollout_work 1.10,
activations 14.05, update_work 5.58; rollout phase 46.83, train phase 33.81; peak 70.17
GiB = 73.9% of 95 GiB -> fits (usable 90%), with float32 master weights.

Compiled for v5p-8 (python -m da3po_jax.plan --config=configs/qwen_math_7b_v5p8.py
--compile=v5p-8; jax 0.10.2, libtpu 0.0.42.1, 2026-12-05), every program ok: compiled
peak 70.13 GiB per chip (eval_generate: 35.09 GiB of arguments, params and the KV cache,
and 20.51 of temporaries, mostly the gathered bf16 weights) -> fits 95 GiB; planned 70.17
(+0.1%). Rollout phase compiled 48.81 / planned 46.83 GiB, train phase 36.26 / 35.84.
Roofline (lower bound): 368 s/step.
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
        mesh=(1, 4, 1),
        prompts_per_round=32,
        eval_prompts=16,
    )
    c.model.logits_chunk = 512
    return c

"""qwen_math.py sized for Qwen2.5-Math-1.5B on a TPU v5e-8 (8 chips x 16 GiB).

    python -m da3po_jax.main --config=configs/qwen_math_1p5b_v5e8.py \
        --config.model.path=/data/Qwen2.5-Math-1.5B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/1p5b_v5e8
    python -m da3po_jax.plan --config=configs/qwen_math_1p5b_v5e8.py --device=v5e --num_devices=8

Changes from qwen_math.py and why: FSDP over the 8 chips (f32 master weights and AdamW
state); sequences capped at the model's 4096-token context (prompts <= 1024, responses
<= 3072, overlong buffer 512); rollout rounds of 32 prompts x 16 and eval calls of 16
prompts x 32 samples (KV cache: 16 GiB chips); 128 groups per step in mini-batches of 32,
packed micro-batches of 16 rows of 4096 tokens (2 per chip), logits in chunks of 512.

Planner (python -m da3po_jax.plan, GiB per chip): params 0.72, optimizer 1.44, grads
1.44, batch 0.01, gathered 0.87, kv_cache 7.00, decode_weights 3.24, rollout_work 0.25,
activations 4.11, update_work 1.23; rollout phase 10.49, train phase 6.78; peak 13.53 GiB
= 84.5% of 16 GiB -> fits (usable 90%; the tightest of the recipes).

Compiled for v5e-8 (python -m da3po_jax.plan --config=configs/qwen_math_1p5b_v5e8.py
--compile=v5e-8; jax 0.10.2, libtpu 0.0.42.1, 2026-12-05), every program ok: compiled
peak 12.88 GiB per chip (eval_generate: 7.72 GiB of arguments, mostly the KV cache, and
3.46 of temporaries, mostly the gathered bf16 weights) -> fits 16 GiB; planned 13.53
(+5.1%). Rollout phase compiled 10.69 / planned 10.49 GiB, train phase 6.53 / 7.65.
Roofline (lower bound): 177 s/step. docs/memory.md has the history (the first compile,
2026-12-03, did not fit).
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
        mesh=(1, 8, 1),
        prompts_per_round=32,
        eval_prompts=16,
    )
    c.model.logits_chunk = 512
    return c

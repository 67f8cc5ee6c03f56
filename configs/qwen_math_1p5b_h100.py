"""qwen_math.py sized for Qwen2.5-Math-1.5B on one H100 (80 GiB).

    python -m da3po_jax.main --config=configs/qwen_math_1p5b_h100.py \
        --config.model.path=/data/Qwen2.5-Math-1.5B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/1p5b_h100
    python -m da3po_jax.plan --config=configs/qwen_math_1p5b_h100.py --device=h100 --num_devices=1

Changes from qwen_math_1p5b_h200.py and why: packed micro-batches of 8 rows of 4096 tokens
instead of 16 (the update's activations halve: the H200 recipe plans at 80.0 GiB here,
over the 72 GiB usable of 80), and 128 decode slots instead of 64 (the rollout phase's
KV cache, 14 GiB, stays under the update's phase).

Planner (python -m da3po_jax.plan, GiB): params 5.75, optimizer 11.50, grads 11.50, batch
0.10, kv_cache 14.00, rollout_work 0.53, activations 24.20, update_work 2.88; rollout
phase 14.53, train phase 38.58; peak 55.93 GiB = 69.9% of 80 GiB -> fits (usable 90%; set
XLA_PYTHON_CLIENT_MEM_FRACTION=.9, JAX preallocates 75% by default).

Compiled for one TPU chip standing in for the GPU (python -m da3po_jax.plan
--config=configs/qwen_math_1p5b_h100.py --compile=v5p-2 --json; jax 0.10.2, libtpu
0.0.42.1, 2026-12-07; docs/results/compile/qwen_math_1p5b_h100.json), every program ok,
no involuntary rematerialization: compiled peak 47.30 GiB (the update), planned 55.18 on
the 95 GiB chip (+16.7%: the planner is high on the update's activations, train phase
37.83 planned vs 29.86 compiled, and low on the rollout, 14.51 vs 18.15). Compile seconds
on 2 shared cores: update 246, ds_round 18, admit_groups 522, decode_steps 52,
eval_admit_groups 651, eval_decode_steps 62. Per step of 128 x 16 responses at the
3072-token cap, at v5p's peak FLOP/s and bandwidth (not an H100's): roofline 389 s,
estimate at 40% MFU and 60% of HBM bandwidth 821 s.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen_math_1p5b_h200  # noqa: E402


def get_config():
    c = qwen_math_1p5b_h200.get_config()
    c.rl.pack_rows = 8
    c.rollout.slots = 128
    return c

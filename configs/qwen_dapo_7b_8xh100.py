"""DAPO's response length on one 8 x H100 (80 GiB) node: Qwen2.5-7B, responses up to
16384 + 4096 tokens; fits by the planner.

    python -m da3po_jax.main --config=configs/qwen_dapo_7b_8xh100.py \
        --config.model.path=/data/Qwen2.5-7B \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/dapo_7b
    python -m da3po_jax.plan --config=configs/qwen_dapo_7b_8xh100.py --device=h100 --num_devices=8

Changes from qwen_math.py and why: Qwen2.5-7B (base), whose 32k context holds DAPO's
prompts of up to 2048 and responses of up to 20480 tokens (16384 + the 4096-token
overlong buffer; Qwen2.5-Math-7B's context is 4096); FSDP over the 8 GPUs; DAPO's 512
prompts x 16 per step in mini-batches of 32, trained on packed micro-batches of one
22528-token row per GPU with blockwise attention (O(T) memory: the naive [heads, T, T]
scores of one such row would be 53 GiB per layer); rollout rounds of 16 prompts x 16 and
eval calls of 8 prompts x 32 samples, the KV cache at 22527 slots being what bounds them.

Planner (python -m da3po_jax.plan, GiB per GPU): params 3.55, optimizer 7.09, grads 7.09,
batch 0.26, gathered 2.03, kv_cache 38.50, decode_weights 15.96, rollout_work 0.41,
activations 18.40, update_work 3.80; rollout phase 54.87, train phase 29.30; peak 67.81
GiB = 84.8% of 80 GiB -> fits (usable 90%; on GPUs set XLA_PYTHON_CLIENT_MEM_FRACTION=.9,
JAX preallocates 75% by default).

Compiled for a TPU of the same chip count (python -m da3po_jax.plan
--config=configs/qwen_dapo_7b_8xh100.py --compile=v5p-16; jax 0.10.2, libtpu 0.0.42.1,
2026-12-05), every program ok: compiled peak 68.21 GiB per chip (eval_generate), planned
67.79 (-0.6%); rollout phase 57.25 / 54.85, train phase 29.97 / 28.49 GiB. Roofline
(lower bound): 12450 s per step of 512 x 16 responses of up to 20480 tokens.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen_math  # noqa: E402


def get_config():
    c = qwen_math.get_config()
    c.model.path = "/path/to/Qwen2.5-7B"  # placeholder: a HF folder
    c.model.preset = "qwen2.5-7b"  # shapes for the planner before the download
    c.model.attention = "auto"  # cuDNN flash attention on the GPUs, never the naive path
    c.mesh.shape = (1, 8, 1)
    c.model.scan_layers = True  # as qwen_math.sized(): one layer's FSDP buffers at a time
    c.rollout.prompts_per_round = 16
    c.ds.max_prompts = 5120  # as qwen_math.py: at most 10 x 512 prompts per step
    c.eval.prompts_per_call = 8
    c.rl.pack_rows = 8  # one packed row of 2048 + 20480 tokens per GPU
    return c

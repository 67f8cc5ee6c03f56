"""The DA3PO paper's recipe (arXiv 2608.27982) for Qwen3-8B-Base: DA3PO (DAPO + DAA,
constant lambda = 2 on the correct responses of hard groups) on DAPO-Math-17K with G = 16,
evaluated on AIME24, AIME25, AIME26, AMC23, Minerva, OlympiadBench and MATH-500
(configs/da3po_qwen3.py holds what the 4B and 8B recipes share).

    # the paper's setup (no argument), or sized for v5p-8, v6e-8 or 8xh100
    python -m da3po_jax.main --config=configs/da3po_qwen3_8b.py:v5p-8 \
        --config.model.path=/data/Qwen3-8B-Base \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/da3po_8b
    # the baselines: DAPO, GRPO, and GSPO (DAPO's recipe with GSPO's sequence-level ratio
    # and its clip range, 3e-4 / 4e-4 around the per-token geometric mean)
    ... --config.algo=dapo
    ... --config.algo=grpo
    ... --config.algo=dapo --config.loss.ratio_level=sequence \
        --config.loss.eps_low=3e-4 --config.loss.eps_high=4e-4
    # fit and compile without the hardware (8xh100: a TPU of the same chip count)
    python -m da3po_jax.plan --config=configs/da3po_qwen3_8b.py:v5p-8 --device=v5p --num_devices=4
    python -m da3po_jax.plan --config=configs/da3po_qwen3_8b.py:v5p-8 --compile=v5p-8 --json

The benchmarks, their k and the baselines are those of configs/da3po_qwen3_4b.py (its
docstring says what each baseline is here).

What differs from the paper and why: the public summaries of the paper give neither its k
per benchmark nor its step count, so k is ours (32 on AIME and AMC, 4 on the rest) and
`train.steps = 500`; prompts longer than 2048 tokens are not trained on (DAPO's prompt
limit). The sized variants keep G = 16 and 512 groups per step in mini-batches of 32, and
change what memory bounds: `rollout.slots` (the continuous engine's KV cache: 32 on
v5p-8, the largest eval k, 64 elsewhere), rounds of 64 prompts for dynamic sampling
(DAPO generates 512 at a time; the continuous engine holds at most 4 x slots / 16
prompts either way), packed micro-batches of one row per data-parallel device. v5p-8 and
8 x H100 keep DAPO's lengths (prompts <= 2048, responses <= 20480 with the 4096-token
overlong buffer) with FSDP over the chips. v6e-8 does not: f32 master weights, AdamW
state and gradients of 8.2B parameters take 19 of its 32 GiB per chip, and one
22528-token row's activations another 15, so there prompts go up to 1024 tokens and
responses up to 8192 (the overlong buffer the preset's fifth, 1638), the model is split
8 ways by tensor parallelism instead of FSDP (no gathered layers, no whole-vocabulary
gradient per chip) and the loss reads the logits in chunks of 256 tokens.

Planner (python -m da3po_jax.plan, GiB per chip, usable 90%):
- v5p-8 (1, 4, 1): params 7.63, optimizer 15.26, grads 15.26, batch 0.52, gathered 2.32,
  kv_cache 24.75, decode_weights 19.07, rollout_work 0.75, activations 14.95, update_work
  6.13; rollout phase 44.57, train phase 36.34; peak 70.30 = 74.0% of 95 -> fits.
- v6e-8 (1, 1, 8): params 3.82, optimizer 7.63, grads 7.63, batch 0.84, gathered 0,
  kv_cache 10.12, decode_weights 3.82, rollout_work 0.19, activations 6.29, update_work
  1.91; rollout phase 14.13, train phase 15.83; peak 28.12 = 87.9% of 32 -> fits.
- 8xh100 (1, 8, 1): params 3.82, optimizer 7.63, grads 7.63, batch 0.26, gathered 2.32,
  kv_cache 24.75, decode_weights 17.16, rollout_work 1.55, activations 17.72 (cuDNN's
  segment mask included), update_work 4.23; rollout phase 43.47, train phase 29.58; peak
  57.49 = 71.9% of 80 -> fits (set XLA_PYTHON_CLIENT_MEM_FRACTION=.9 on the GPUs).

Compiled (python -m da3po_jax.plan --config=configs/da3po_qwen3_8b.py:HARDWARE
--compile=TOPOLOGY --json; jax 0.10.2, libtpu 0.0.42.1, 2026-12-07, on 2 shared CPU
cores; the outputs are docs/results/compile/da3po_qwen3_8b_*.json), with the eval
programs of both k (4 and 32):
- v5p-8: every program ok, no involuntary rematerialization, no parameter gather beyond
  one layer outside the generate programs. Compiled peak 74.49 GiB per chip (the decode
  steps, rollout and eval alike) -> fits 95 GiB; planned 70.30 (-5.6%: the planner is
  low here). Resident state compiled 23.43 / planned 23.40 GiB; rollout phase 51.06 /
  44.57; train phase 47.95 / 38.66 (the plan is low on the update's 22528-token rows).
  Compile seconds: update 167, ds_round 12, admit_groups 660, decode_steps 105,
  eval_admit_groups 650 (k = 4) / 556 (k = 32), eval_decode_steps 96 / 114. Per step of
  512 x 16 responses all at the 20480-token cap: roofline (lower bound) 37028 s, estimate
  at 40% MFU and 60% of HBM bandwidth 68856 s.
- v6e-8: every program ok, no involuntary rematerialization, no gathered layers (tensor
  parallelism only). Compiled peak 31.87 GiB per chip (the update) -> within 32 GiB, but
  by 0.13 GiB only: planned 28.12 (-11.8%, the planner is low on the update: train phase
  18.98 compiled vs 15.83 planned; resident 12.29 / 12.29; rollout phase 12.66 / 14.13).
  Too tight to trust on the chip: shorter rows or smaller logits chunks are the next
  step. Compile seconds: update 246, ds_round 9, admit_groups 1601, decode_steps 209,
  eval_admit_groups 1445 (k = 4) / 1884 (k = 32), eval_decode_steps 305 / 118. Per step
  of 512 x 16 responses at the 8192-token cap: roofline 4578 s, estimate 8159 s.
- 8xh100 (on v5p-16): not compiled yet (45 to 60 minutes on 2 CPU cores); its plan is
  above.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import da3po_qwen3  # noqa: E402


def get_config(hardware: str = ""):
    """The paper's setup, or sized for `hardware`: v5p-8, v6e-8 or 8xh100."""
    return da3po_qwen3.sized("8b", hardware)

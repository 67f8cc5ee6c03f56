"""The DA3PO paper's recipe (arXiv 2608.27982) for Qwen3-4B-Base: DA3PO (DAPO + DAA,
constant lambda = 2 on the correct responses of hard groups) on DAPO-Math-17K with G = 16,
evaluated on AIME24, AIME25, AIME26, AMC23, Minerva, OlympiadBench and MATH-500
(configs/da3po_qwen3.py holds what the 4B and 8B recipes share).

    # the paper's setup (no argument), or sized for v5p-8, v6e-8 or 8xh100
    python -m da3po_jax.main --config=configs/da3po_qwen3_4b.py:v5p-8 \
        --config.model.path=/data/Qwen3-4B-Base \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/da3po_4b
    # the baselines: DAPO, GRPO, and GSPO (DAPO's recipe with GSPO's sequence-level ratio
    # and its clip range, 3e-4 / 4e-4 around the per-token geometric mean)
    ... --config.algo=dapo
    ... --config.algo=grpo
    ... --config.algo=dapo --config.loss.ratio_level=sequence \
        --config.loss.eps_low=3e-4 --config.loss.eps_high=4e-4
    # fit and compile without the hardware (8xh100: a TPU of the same chip count)
    python -m da3po_jax.plan --config=configs/da3po_qwen3_4b.py:v5p-8 --device=v5p --num_devices=4
    python -m da3po_jax.plan --config=configs/da3po_qwen3_4b.py:v5p-8 --compile=v5p-8 --json

The benchmarks are `eval.suites` under `da3po_qwen3.EVAL_DIR` (a placeholder: override
`--config.eval.suites`, docs/evaluation.md); each reports avg@k and pass@k, k = 32 on
AIME and AMC and 4 on Minerva, OlympiadBench and MATH-500, at temperature 1.0 and top-p 0.7.
GRPO here is the library's (`algo=grpo`: 1 / 0 reward, no dynamic sampling, sequence-mean
loss, clip 0.2); GSPO's sequence ratio is the masked mean of the token log-ratios with its
full gradient, not GSPO's stop-gradient form (same value; docs/algorithms.md), and this
recipe keeps DAPO's dynamic sampling and token-level loss under it.

What differs from the paper and why: the public summaries of the paper give neither its k
per benchmark nor its step count, so k is ours (above) and `train.steps = 500`; prompts
longer than 2048 tokens are not trained on (DAPO's prompt limit). The sized variants keep
G = 16, DAPO's lengths (prompts <= 2048, responses <= 20480 with the 4096-token overlong
buffer: 22528 of Qwen3-Base's 32768 positions) and 512 groups per step in mini-batches of
32, and change only what memory bounds: FSDP over the chips, `rollout.slots` (the KV
cache of the continuous engine: 64 on v5p-8, 32 on v6e-8, the largest eval k, 96 on
8 x H100), rounds of 64 prompts for dynamic sampling (DAPO generates 512 at a time; the
continuous engine holds at most 4 x slots / 16 prompts either way), packed
micro-batches of one 22528-token row per data-parallel device (4 on v5p-8 and v6e-8, 8 on
8 x H100), tensor parallelism 2 on v6e-8 (the decode copy of the weights split in two).

Planner (python -m da3po_jax.plan, GiB per chip, usable 90%):
- v5p-8 (1, 4, 1): params 3.75, optimizer 7.49, grads 7.49, batch 0.52, gathered 1.45,
  kv_cache 49.50, decode_weights 9.37, rollout_work 1.51, activations 10.48, update_work
  3.32; rollout phase 60.37, train phase 21.30; peak 73.59 = 77.5% of 95 -> fits.
- v6e-8 (1, 4, 2): params 1.87, optimizer 3.75, grads 3.75, batch 0.52, gathered 1.45,
  kv_cache 12.38, decode_weights 4.68, rollout_work 0.38, activations 10.38, update_work
  1.66; rollout phase 17.44, train phase 15.79; peak 25.02 = 78.2% of 32 -> fits.
- 8xh100 (1, 8, 1): params 1.87, optimizer 3.75, grads 3.75, batch 0.27, gathered 1.45,
  kv_cache 37.12, decode_weights 8.43, rollout_work 2.33, activations 13.25 (cuDNN's
  segment mask included), update_work 2.39; rollout phase 47.88, train phase 19.39; peak
  55.22 = 69.0% of 80 -> fits (set XLA_PYTHON_CLIENT_MEM_FRACTION=.9 on the GPUs).

Compiled (python -m da3po_jax.plan --config=configs/da3po_qwen3_4b.py:HARDWARE
--compile=TOPOLOGY --json; jax 0.10.2, libtpu 0.0.42.1, 2026-12-07, on 2 shared CPU
cores; the outputs are docs/results/compile/da3po_qwen3_4b_*.json), with the eval
programs of both k (4 and 32):
- v5p-8: every program ok, no involuntary rematerialization, no parameter gather beyond
  one layer outside the generate programs. Compiled peak 70.94 GiB per chip (the decode
  steps, rollout and eval alike: 53.25 GiB of arguments, mostly the slots' KV cache, and
  9.58 of temporaries) -> fits 95 GiB; planned 73.59 (+3.7%). Rollout phase compiled
  59.12 / planned 60.37 GiB; train phase 28.13 / 22.75 (the plan is low on the update's
  22528-token rows, which the rollout phase outweighs). Compile seconds: update 263,
  ds_round 60, admit_groups 723, decode_steps 124, eval_admit_groups 687 (k = 4) / 535
  (k = 32), eval_decode_steps 132 / 124. Per step of 512 x 16 responses all at the
  20480-token cap: roofline (lower bound) 34395 s, estimate at 40% MFU and 60% of HBM
  bandwidth 62686 s.
- v6e-8: every program ok, no involuntary rematerialization, no parameter gather beyond
  one layer. Compiled peak 23.91 GiB per chip (the decode steps, rollout and eval alike)
  -> fits 32 GiB; planned 25.02 (+4.7%). Resident state compiled 6.16 / planned 6.14 GiB;
  rollout phase 17.75 / 17.44; train phase 16.27 / 17.24. Compile seconds (four compiles
  sharing the 2 cores): update 322, ds_round 16, admit_groups 1228, decode_steps 108,
  eval_admit_groups 1111 (k = 4) / 1822 (k = 32), eval_decode_steps 399 / 270. Per
  full-length step: roofline 25180 s, estimate 43307 s.
- 8xh100 (compiled on v5p-16: 8 chips, 2 hosts, v5p's 95 GiB standing in for the H100's
  80): every program ok, no involuntary rematerialization, no parameter gather beyond
  one layer outside the generate programs. Compiled peak 52.31 GiB per chip (the decode
  steps, rollout and eval alike) -> under the H100's 80 GiB; planned 55.15 (+5.4%).
  Resident state compiled 5.97 / planned 5.89 GiB; rollout phase 46.34 / 47.81; train
  phase 20.40 / 18.00. Compile seconds: update 285, ds_round 17, admit_groups 741,
  decode_steps 140, eval_admit_groups 895 (k = 4) / 940 (k = 32), eval_decode_steps 202 /
  178. Per full-length step, at v5p's peak and bandwidth (not an H100's): roofline
  17436 s, estimate 31740 s.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import da3po_qwen3  # noqa: E402


def get_config(hardware: str = ""):
    """The paper's setup, or sized for `hardware`: v5p-8, v6e-8 or 8xh100."""
    return da3po_qwen3.sized("4b", hardware)

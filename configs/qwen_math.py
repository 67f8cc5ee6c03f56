"""The real recipe: DA3PO on Qwen2.5-Math-7B with DAPO-Math-17k, at the DAPO paper's settings
except the length (Qwen2.5-Math-7B has 4096 positions).

    python -m da3po_jax.main --config=configs/qwen_math.py \
        --config.model.path=/data/Qwen2.5-Math-7B \
        --config.data.train_path=/data/dapo-math-17k.parquet \
        --config.data.eval_path=/data/aime-2024.parquet --workdir=/data/runs/qwen_math

DAPO settings: AdamW lr 1e-6 constant after 20 warm-up steps, 512 prompts x 16 samples per
step, mini-batches of 32 prompts, clip 0.2 / 0.28, temperature 1.0, +1 / -1 rewards,
token-level loss, dynamic sampling (up to 10 generation rounds); eval avg@32 at top-p 0.7.
The length is not DAPO's: its 20480-token responses do not fit the model's
max_position_embeddings = 4096 (the run refuses any prompt bucket + response cap above it),
so prompts go up to 1024 tokens and responses up to 3072, with a 512-token overlong buffer
(about DAPO's fifth of the cap). Longer responses need the context extended explicitly,
`--config.model.max_position_embeddings=N --config.model.rope_theta=THETA` (both written to
the exported config.json; e.g. 16384 and 40000, a choice some Qwen2.5-Math RL recipes
make), a change to the model this recipe does not make for you. `--config.algo=dapo` or `grpo` switches the
algorithm-dependent fields. DAPO-Math-17k's user messages already carry the DAPO
`Answer:` instruction, hence the raw template; its Parquet repeats rows, hence dedupe.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.algo = "da3po"
    c.model.path = "/path/to/Qwen2.5-Math-7B"  # placeholder: set to a HF folder
    c.model.preset = "qwen2.5-math-7b"  # shapes for the planner before the download
    c.model.param_dtype = "float32"  # master weights and AdamW state in f32
    c.model.dtype = "bfloat16"  # bf16 matmuls
    c.model.remat = True
    c.model.logits_chunk = 1024

    c.data.source = "parquet"
    c.data.train_path = ""  # required: dapo-math-17k.parquet
    c.data.eval_path = ""  # e.g. AIME 2024 as Parquet/JSONL with prompt + answer fields
    c.data.template = "raw"
    c.data.dedupe = True

    c.rollout.prompts_per_round = 512
    c.rollout.group_size = 16
    c.rollout.prompt_buckets = (256, 512, 1024)
    c.rollout.max_new_tokens = 3072  # + the 1024-token bucket = the model's 4096 positions
    c.rollout.temperature = 1.0
    c.rl.train_prompts = 512
    c.rl.mini_batch_prompts = 32
    c.rl.pack_rows = 8  # packed rows of 1024 + 3072 tokens, one per device on 8 devices
    c.ds.max_prompts = 5120  # 10 rounds of 512
    c.overlong.buffer = 512
    c.overlong.penalty = 1.0

    c.optim.lr = 1e-6
    c.optim.warmup_steps = 20
    c.optim.schedule = "constant"
    c.optim.weight_decay = 0.1
    c.optim.grad_clip = 1.0

    c.train.steps = 400
    c.train.eval_every = 10
    c.train.checkpoint_every = 10
    c.eval.num_samples = 32
    c.eval.top_p = 0.7
    c.eval.max_prompts = 0  # all
    c.eval.prompts_per_call = 30
    c.reward.num_workers = 16
    c.mesh.shape = (1, -1, 1)  # FSDP over every device
    return c


def sized(c, path: str, preset: str, mesh: tuple, prompts_per_round: int, eval_prompts: int):
    """The changes shared by the planner-sized recipes (`qwen_math_{7b,1p5b}_*.py`): float32
    master weights with bf16 compute, remat and scanned layers, prompts up to 1024 and
    responses up to 3072 tokens (the Qwen2.5-Math context is 4096), 128 prompts per step in
    mini-batches of 32 and packed micro-batches of 16 rows of 4096 tokens (the padded size
    of one prompt's 16 responses), and the given mesh, rollout round and eval call sizes."""
    c.model.path = path  # placeholder: a HF folder
    c.model.preset = preset  # shapes for the planner before the download
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"
    c.model.remat = True
    # one layer body under lax.scan: per-layer buffers cannot be hoisted across layers (the
    # TPU compile of the 1.5B update holds 8.0 GiB of temporaries scanned, 12.2 unscanned:
    # docs/memory.md), and a compile takes ~150 s instead of ~470 s on 2 CPU cores
    c.model.scan_layers = True
    c.rollout.prompt_buckets = (256, 512, 1024)
    c.rollout.max_new_tokens = 3072
    c.overlong.buffer = 512
    c.rollout.prompts_per_round = prompts_per_round
    c.ds.max_prompts = 10 * prompts_per_round
    c.rl.train_prompts = 128
    c.rl.mini_batch_prompts = 32
    c.rl.pack_rows = 16  # rows of 1024 + 3072 tokens, as many as one prompt's 16 responses
    c.eval.prompts_per_call = eval_prompts
    c.mesh.shape = mesh
    return c

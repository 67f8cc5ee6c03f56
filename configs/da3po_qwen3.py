"""The DA3PO paper's recipe (arXiv 2608.27982), shared by `da3po_qwen3_4b.py` and
`da3po_qwen3_8b.py`: DA3PO (DAPO + DAA, lambda = 2 on the correct responses of hard groups)
on a Qwen3 base model with DAPO-Math-17K, G = 16, and the seven benchmarks of its tables.

    python -m da3po_jax.main --config=configs/da3po_qwen3.py:4b \
        --config.model.path=/data/Qwen3-4B-Base \
        --config.data.train_path=/data/dapo-math-17k.parquet --workdir=/data/runs/da3po_4b

`python -m da3po_jax.prepare --out=DIR` downloads the model, DAPO-Math-17K and the
benchmarks (or converts local copies) and prints the overrides that use them
(docs/prepare.md).

`get_config(size)` is the paper's setup of one model size, `4b` or `8b`, unsized; the
recipes of each size (`da3po_qwen3_4b.py`, `da3po_qwen3_8b.py`) document it and take a
hardware name for the variants sized by `sized` (`SIZES`). The algorithm is the
preset of `algo=da3po` (`config/resolve.py: algorithm_preset`): dynamic sampling, clip
0.2 / 0.28, token-level loss, +1 / -1 reward with DAPO's overlong shaping over the last
fifth of the response cap, and DAA's constant lambda = 2; nothing here restates it, so
`--config.algo=dapo` or `grpo` switches every dependent field for the baselines.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import base  # noqa: E402

# placeholder: the folder holding one file per benchmark, as `python -m da3po_jax.prepare
# --out=DIR` writes them (DIR/data/<name>.jsonl, the published rows)
EVAL_DIR = "/path/to/prepared/data"

# (suite name = its built-in format, file under EVAL_DIR, k): avg@k and pass@k of each.
# The public summaries of the paper do not give its k; 32 samples on the small AIME and
# AMC sets (30 and 40 problems, where avg@1 is noise) and 4 on the larger ones are ours.
BENCHMARKS = (
    ("aime2024", "aime2024.jsonl", 32),
    ("aime2025", "aime2025.jsonl", 32),
    ("aime2026", "aime2026.jsonl", 32),
    ("amc23", "amc23.jsonl", 32),
    ("minerva", "minerva.jsonl", 4),
    ("olympiadbench", "olympiadbench.jsonl", 4),
    ("math500", "math500.jsonl", 4),
)

MODELS = {
    "4b": ("/path/to/Qwen3-4B-Base", "qwen3-4b"),
    "8b": ("/path/to/Qwen3-8B-Base", "qwen3-8b"),
}


def eval_suites(folder: str = EVAL_DIR) -> tuple[str, ...]:
    """The seven benchmarks as `eval.suites` strings, their files under `folder`."""
    return tuple(f"{name} path={folder}/{file} k={k}" for name, file, k in BENCHMARKS)


def paper(size: str):
    """The paper's setup for Qwen3-`size`-Base (see the module docstring)."""
    if size not in MODELS:
        raise ValueError(f"unknown model size {size!r}; known: {', '.join(MODELS)}")
    c = base.get_config()
    c.algo = "da3po"
    c.model.path, c.model.preset = MODELS[size]  # placeholder path; preset: the planner's shapes
    c.model.param_dtype = "float32"  # master weights and AdamW state: bf16 rounds away lr=1e-6
    c.model.dtype = "bfloat16"
    c.model.remat = True
    # one layer body under lax.scan: per-layer buffers are not hoisted across layers, and
    # a compile takes a third of the unrolled one's time (configs/qwen_math.py: sized)
    c.model.scan_layers = True

    c.data.source = "parquet"
    c.data.train_path = ""  # required: dapo-math-17k.parquet
    c.data.eval_path = ""  # the benchmarks are the suites below
    # DAPO-Math-17K's rows (BENCHMARK_FORMATS["dapo_math_17k"]): the user message already
    # carries DAPO's `Answer:` instruction, hence the raw template; rows repeat, hence dedupe
    c.data.prompt_field = "prompt"
    c.data.answer_field = "reward_model.ground_truth"
    c.data.template = "raw"
    c.data.dedupe = True

    # DAPO's lengths: prompts up to 2048 tokens, responses up to 20480 (16384 + the
    # 4096-token overlong buffer, the preset's fifth of the cap), 22528 of Qwen3-Base's
    # 32768 positions
    c.rollout.prompt_buckets = (256, 512, 1024, 2048)
    c.rollout.max_new_tokens = 20480
    c.rollout.group_size = 16
    c.rollout.temperature = 1.0
    c.rollout.prompts_per_round = 512
    c.rl.train_prompts = 512
    c.rl.mini_batch_prompts = 32
    c.rl.pack_rows = 8  # one packed row of 2048 + 20480 tokens per device on 8 devices
    c.ds.max_prompts = 5120  # at most 10 generation rounds of 512 per step

    c.optim.lr = 1e-6
    c.optim.warmup_steps = 10
    c.optim.schedule = "constant"
    c.optim.weight_decay = 0.1
    c.optim.grad_clip = 1.0

    c.train.steps = 500
    c.train.eval_every = 10
    c.train.checkpoint_every = 10
    c.eval.suites = eval_suites()
    c.eval.num_samples = 32  # the largest suite k: rollout.slots is checked against it
    c.eval.temperature = 1.0
    c.eval.top_p = 0.7
    c.eval.max_prompts = 0
    c.eval.prompts_per_call = 64
    c.reward.num_workers = 16
    c.mesh.shape = (1, -1, 1)  # FSDP over every device
    return c


# Per (model size, hardware): the mesh (data, fsdp, tensor), the continuous engine's slots
# (at least 32, the largest eval k; a multiple of the data x fsdp devices), groups per step,
# packed rows per micro-batch (one per data x fsdp device), and where DAPO's lengths do not
# fit, the prompt buckets, response cap and the loss's logits chunk.
SIZES = {
    ("4b", "v5p-8"): dict(mesh=(1, 4, 1), slots=64, train_prompts=512, pack_rows=4),
    ("4b", "v6e-8"): dict(mesh=(1, 4, 2), slots=32, train_prompts=512, pack_rows=4),
    ("4b", "8xh100"): dict(mesh=(1, 8, 1), slots=96, train_prompts=512, pack_rows=8),
    ("8b", "v5p-8"): dict(mesh=(1, 4, 1), slots=32, train_prompts=512, pack_rows=4),
    ("8b", "v6e-8"): dict(
        mesh=(1, 1, 8),
        slots=64,
        train_prompts=512,
        pack_rows=1,
        prompt_buckets=(256, 512, 1024),
        max_new_tokens=8192,
        logits_chunk=256,
    ),
    ("8b", "8xh100"): dict(mesh=(1, 8, 1), slots=64, train_prompts=512, pack_rows=8),
}
HARDWARE = ("v5p-8", "v6e-8", "8xh100")


def sized(size: str, hardware: str):
    """`paper(size)`, or with `hardware` (one of `HARDWARE`) sized to fit it (`SIZES`).

    Raises:
      ValueError: an unknown hardware name, listing the known ones.
    """
    c = paper(size)
    if not hardware:
        return c
    if hardware not in HARDWARE:
        raise ValueError(
            f"unknown hardware {hardware!r} for the Qwen3-{size.upper()} recipe; known: "
            f"{', '.join(HARDWARE)} (or none: the paper's unsized setup)"
        )
    s = SIZES[size, hardware]
    c.mesh.shape = s["mesh"]
    c.rollout.slots = s["slots"]
    # dynamic sampling in rounds of 64 prompts: the continuous engine holds at most
    # 4 x slots / G prompts whatever the round, and smaller rounds overshoot less
    c.rollout.prompts_per_round = 64
    c.rl.train_prompts = s["train_prompts"]
    c.ds.max_prompts = 10 * s["train_prompts"]
    c.rl.pack_rows = s["pack_rows"]
    c.eval.prompts_per_call = 32
    if "max_new_tokens" in s:
        c.rollout.prompt_buckets = s["prompt_buckets"]
        c.rollout.max_new_tokens = s["max_new_tokens"]
    c.model.logits_chunk = s.get("logits_chunk", 512)
    return c


def get_config(size: str = "8b"):
    """The paper's unsized setup for `size` (`--config=configs/da3po_qwen3.py:4b`)."""
    return paper(size)

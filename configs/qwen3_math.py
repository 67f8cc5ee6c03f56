"""DA3PO on Qwen3-8B-Base with DAPO-Math-17k (same recipe as qwen_math.py, shorter responses).

    python -m da3po_jax.main --config=configs/qwen3_math.py \
        --config.model.path=/data/Qwen3-8B-Base --config.data.train_path=/data/dapo-math-17k.parquet
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import qwen_math  # noqa: E402


def get_config():
    c = qwen_math.get_config()
    c.model.path = "/path/to/Qwen3-8B-Base"  # placeholder: a HF folder (or Qwen3-1.7B/4B)
    c.model.preset = "qwen3-8b"  # shapes for the planner before the download
    c.rollout.max_new_tokens = 8192
    c.overlong.buffer = 2048
    c.rollout.prompt_buckets = (256, 512, 1024)
    return c

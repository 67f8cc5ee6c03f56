"""On-policy distillation on the embedded tiny task: a less-trained student learns from a
longer-trained teacher of the same architecture, with no downloads.

    python -m da3po_jax.main --config=configs/tiny_opd.py --workdir=/tmp/opd_s0
    python -m da3po_jax.main --config=configs/tiny_opd.py --config.algo=ra_opd \\
        --config.seed=1 --workdir=/tmp/ra_opd_s1

Both models are SFT warm starts of the tiny model (`configs/tiny_math.py`), built by the
first run and cached in `teacher.path` / `sft.out_dir` (default under /tmp/da3po_tiny_opd,
shared by every run that points there): the teacher trains for `teacher.sft_steps` full
steps, the student stops early at `sft.stop_acc`. So OPD and RA-OPD runs of several seeds
start from the same teacher and the same student; point both fields at other folders (or
delete them) to rebuild. Build the cache with one run before starting parallel seeds.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import tiny_math  # noqa: E402

CACHE = "/tmp/da3po_tiny_opd"


def get_config():
    c = tiny_math.get_config()
    c.algo = "opd"  # or ra_opd
    c.teacher.path = os.path.join(CACHE, "teacher")
    c.teacher.sft_steps = 1200  # built when the folder is missing
    c.teacher.sft_stop_acc = 0.0  # the whole cosine schedule
    c.sft.out_dir = os.path.join(CACHE, "student")
    c.sft.stop_acc = 0.1  # a weaker student than tiny_math's 0.25
    c.opd.coef = 1.0
    c.opd.gamma = 0.0
    c.train.steps = 100
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    return c

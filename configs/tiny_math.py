"""The embedded default: a tiny Qwen-architecture model learns synthetic arithmetic on CPU.

No downloads: the tokenizer is a small BPE built into the workdir, the model starts from
random weights, a short supervised warm-up (cached in the workdir) brings it to a useful
RL regime, then DA3PO (by default; --config.algo=grpo|dapo) trains on held-out-disjoint
prompts and reports held-out accuracy by difficulty tier.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # siblings, from any cwd
import base  # noqa: E402


def get_config():
    c = base.get_config()
    c.algo = "da3po"
    c.model.preset = "tiny-qwen2"
    c.model.logits_chunk = 64
    c.tokenizer.build_tiny = True
    c.tokenizer.vocab_size = 512
    c.data.source = "synthetic"
    c.data.template = "tiny"
    c.data.synthetic_train = 1500
    c.data.synthetic_eval = 300
    c.data.synthetic_sft = 3000

    c.rollout.prompts_per_round = 32
    c.rollout.group_size = 8
    c.rollout.prompt_buckets = (32, 64)
    c.rollout.max_new_tokens = 48
    c.rl.train_prompts = 32
    c.rl.mini_batch_prompts = 16
    c.ds.max_prompts = 96  # 3 rounds of 32

    c.optim.lr = 1e-4
    c.optim.warmup_steps = 5
    c.optim.weight_decay = 0.0
    c.train.steps = 150
    c.train.eval_every = 25
    c.train.checkpoint_every = 25
    c.train.export_final = True

    c.eval.num_samples = 4
    c.eval.max_prompts = 300
    c.eval.prompts_per_call = 100

    c.sft.enable = True
    c.sft.steps = 2000  # at most; stops once accuracy reaches sft.stop_acc
    c.sft.batch_size = 64
    c.sft.lr = 3e-3
    c.sft.max_len = 80
    c.sft.stop_acc = 0.25
    c.sft.check_every = 100
    c.reward.num_workers = 1
    return c

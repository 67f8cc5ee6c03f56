"""Base configuration: every field the trainer reads, with its default.

Recipes import `get_config()` from here and change a few fields. Fields left as
placeholders (None) are filled from the algorithm preset (`config.algo`) at start-up, so
`--config.algo=dapo` on the command line switches every dependent default, while an
explicit `--config.loss.eps_high=0.3` still wins. See docs/algorithms.md for the meaning of
each RL field.
"""

from ml_collections import config_dict
from ml_collections.config_dict import placeholder


def get_config() -> config_dict.ConfigDict:
    c = config_dict.ConfigDict()
    c.algo = "da3po"  # grpo | dapo | da3po | opd | ra_opd
    c.stage = "rl"  # rl | sft
    c.seed = 0

    c.model = config_dict.ConfigDict()
    c.model.path = ""  # HF folder (config.json + safetensors); "" = random init from preset
    c.model.preset = "tiny-qwen2"  # used when path is ""
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"
    c.model.logits_chunk = 512
    c.model.remat = False
    c.model.attention = (
        "auto"  # auto | naive | blockwise | cudnn | splash (training forward, prefill)
    )
    c.model.attention_block = 512  # query/key block of the blockwise kernels
    # continuous engine's decode step: auto (ragged on TPU) | blockwise (pure JAX) | ragged
    # (the Pallas TPU kernel reading only live KV pages; interpreted off TPU: slow)
    c.model.decode_attention = "auto"
    c.model.scan_layers = False  # layers stacked under lax.scan: compile time flat in depth
    c.model.remat_policy = "nothing"  # nothing | dots: what a rematerialised layer keeps
    c.model.init_checkpoint = ""  # HF folder to start RL from (e.g. an SFT export)

    c.tokenizer = config_dict.ConfigDict()
    c.tokenizer.path = ""  # "" = the model folder
    c.tokenizer.build_tiny = False  # build the tiny BPE tokenizer in the workdir
    c.tokenizer.vocab_size = 512  # of the tiny tokenizer
    c.tokenizer.system_prompt = ""

    c.data = config_dict.ConfigDict()
    c.data.source = "synthetic"  # synthetic | jsonl | parquet | tfds
    c.data.train_path = ""
    c.data.eval_path = ""
    c.data.prompt_field = ""  # "" = first of prompt / problem / question (dotted paths ok)
    c.data.answer_field = ""  # "" = first of answer / reward_model.ground_truth / solution
    c.data.answer_mode = "auto"  # auto | raw | boxed | gsm8k
    c.data.dedupe = False
    c.data.template = "dapo"  # dapo | boxed | tiny | raw | a string with {problem}
    c.data.tfds_name = ""  # e.g. "gsm8k" for data.source = "tfds"
    c.data.eval_split = "test"  # TFDS split for eval
    c.data.synthetic_train = 4000
    c.data.synthetic_eval = 300
    c.data.synthetic_sft = 4000
    # relative share of each synthetic tier (easy, medium, hard, harder), every split
    c.data.synthetic_tier_weights = (1.0, 1.0, 1.0, 0.0)

    c.rollout = config_dict.ConfigDict()
    # continuous (continuous batching over rollout.slots rows) | static (each round one
    # batch decoded until its longest row stops); rollout/engines.py: ENGINES
    c.rollout.engine = "continuous"
    c.rollout.slots = 64  # continuous: rows decoded together (S)
    c.rollout.steps_per_call = 16  # continuous: decode steps per jitted call (K)
    c.rollout.attention_block = 128  # continuous: keys per decode-attention block
    # under a mesh, generation reads the compute-dtype weights gathered over data x fsdp
    # (one copy per device while it runs) instead of all-gathering them every decode step
    c.rollout.gather_weights = True
    c.rollout.prompts_per_round = 16  # prompts in one generation round
    c.rollout.group_size = 8  # G samples per prompt
    c.rollout.prompt_buckets = (64, 128, 256, 512, 1024, 2048)
    c.rollout.max_new_tokens = 64
    c.rollout.temperature = 1.0
    c.rollout.top_p = 1.0
    c.rollout.top_k = 0
    c.rollout.logp_old = "sampler"  # sampler | recompute
    # Truncated importance sampling: when temperature / top-k / top-p make the sampling
    # distribution mu differ from the temperature-1 policy, each token's loss is weighted by
    # min(pi_old / mu, tis_cap); 0 = off. Not applied when the two coincide.
    c.rollout.tis_cap = 2.0
    # Partial rollouts (continuous engine): optimizer steps a group may stay in flight,
    # generating under newer weights, before dynamic sampling judges it; 0 = every group
    # admitted in a step finishes in it. > 0 trains with the decoupled objective (clip
    # against the step's weights, importance weight behaviour -> them capped at tis_cap).
    c.rollout.max_staleness = 0
    # keys/values of a response carried into a new step: keep (stale) | recompute (prefill
    # prompt + generated prefix under the new weights; the cache is freed for the update)
    c.rollout.partial_kv = "keep"

    c.rl = config_dict.ConfigDict()
    c.rl.train_prompts = 16  # groups per optimizer step batch
    c.rl.mini_batch_prompts = 8  # groups per optimizer update
    c.rl.micro_batch_prompts = 0  # 0 = whole mini-batch in one pass (rl.packing off)
    # Packing: the update's forwards run on micro-batches of pack_rows rows of pack_length
    # tokens, each row holding several (prompt, response) sequences, so the cost follows the
    # real tokens, not prompt bucket + max_new_tokens per response (docs/design.md).
    c.rl.packing = True
    c.rl.pack_length = 0  # tokens per packed row; 0 = prompt bucket + max_new_tokens
    c.rl.pack_rows = 8  # packed rows per micro-batch (a multiple of the data-parallel devices)
    c.rl.num_iterations = 1

    c.adv = config_dict.ConfigDict()
    c.adv.estimator = "grpo"  # grpo | rloo (leave-one-out); rl.ADVANTAGE_ESTIMATORS
    c.adv.norm = "std"  # std | none (Dr.GRPO); grpo only
    c.adv.std_ddof = 1
    c.adv.eps = 1e-6

    c.ds = config_dict.ConfigDict()
    c.ds.enable = placeholder(bool)
    c.ds.metric = "acc"
    c.ds.max_prompts = 64  # prompts admitted per step at most

    c.daa = config_dict.ConfigDict()
    c.daa.enable = placeholder(bool)
    c.daa.estimator = "power"  # power | bayes | history
    c.daa.tau = 0.5
    c.daa.beta = 0.5
    c.daa.lambda_max = 4.0
    c.daa.gamma = 0.5
    c.daa.prior_ema = 0.9
    c.daa.history_decay = 0.5
    c.daa.apply_to = "correct"  # correct | both (control)

    c.overlong = config_dict.ConfigDict()
    c.overlong.filter = placeholder(bool)
    c.overlong.buffer = placeholder(int)  # tokens
    c.overlong.penalty = 1.0

    c.loss = config_dict.ConfigDict()
    c.loss.eps_low = 0.2
    c.loss.eps_high = placeholder(float)
    c.loss.clip_ratio_c = 3.0
    c.loss.ratio_level = "token"
    c.loss.agg = placeholder(str)
    c.loss.kl_coef = 0.0
    c.loss.kl_estimator = "k3"

    # On-policy distillation (algo = opd | ra_opd): a frozen teacher with the student's
    # tokenizer scores the student's samples; see docs/algorithms.md "OPD" / "RA-OPD".
    c.teacher = config_dict.ConfigDict()
    c.teacher.path = ""  # HF folder of the teacher (config.json + safetensors [+ tokenizer])
    c.teacher.preset = ""  # random-init teacher of this preset when path is "" (tests)
    c.teacher.seed = 1  # init seed of a preset teacher
    c.teacher.sft_steps = 0  # > 0: build a missing teacher.path by an SFT warm start ...
    c.teacher.sft_stop_acc = 0.0  # ... of this many steps / stopping at this accuracy
    c.teacher.eval = True  # evaluate the teacher on the held-out set once at start

    c.opd = config_dict.ConfigDict()
    c.opd.coef = 1.0  # A_t = -coef * (logp_student_old - logp_teacher), per token
    c.opd.gamma = 0.0  # discount of the per-token return (0: no discounting)
    c.opd.with_outcome = False  # add the GRPO outcome advantage to every token

    c.ra_opd = config_dict.ConfigDict()
    c.ra_opd.delta = 0.0  # aligned iff (c = 1 and D > delta) or (c = 0 and D < -delta)
    c.ra_opd.baseline = "none"  # none | group_mean (compare D with its group mean)

    c.reward = config_dict.ConfigDict()
    c.reward.correct = 1.0
    c.reward.incorrect = 0.0
    c.reward.timeout_s = 5.0
    c.reward.num_workers = 2
    c.reward.verifier = "builtin"  # builtin | math_verify (needs: pip install math-verify)
    # last_expression | none: the answer of a response with no box, `Answer:` line or
    # "the answer is": its last math expression or number, or none
    c.reward.fallback = "last_expression"

    c.optim = config_dict.ConfigDict()
    c.optim.lr = 1e-6
    c.optim.warmup_steps = 20
    c.optim.schedule = "constant"  # constant | cosine
    c.optim.weight_decay = 0.01
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.grad_clip = 1.0

    c.train = config_dict.ConfigDict()
    c.train.steps = 100
    # > 0: also stop after the step at which the generated response tokens (every sample
    # of every round, filtered groups included) reach this total; train.steps stays a cap
    c.train.token_budget = 0
    c.train.eval_every = 20
    c.train.checkpoint_every = 20
    c.train.keep_checkpoints = 2
    # steps in a row whose every update had a non-finite loss / gradient (each skipped,
    # params and optimizer unchanged) before the run stops with an error; 0 = never stop
    c.train.max_nonfinite_steps = 3
    c.train.wandb_project = ""  # "" = no W&B
    c.train.export_final = False  # write the final policy as a HF folder <workdir>/final_model

    c.eval = config_dict.ConfigDict()
    c.eval.num_samples = 4  # k of avg@k / pass@k
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.max_prompts = 256
    c.eval.max_new_tokens = 0  # 0 = rollout.max_new_tokens
    c.eval.prompts_per_call = 64
    c.eval.group_by = "tier"  # avg@k / pass@k per tier, "source" or a dataset field; "" = none
    c.eval.log_samples = 4  # responses logged per eval (eval_samples.jsonl, TensorBoard text)

    c.sft = config_dict.ConfigDict()
    c.sft.enable = False  # warm start before RL (cached in the workdir)
    c.sft.out_dir = ""  # where the warm start is cached; "" = <workdir>/sft_model
    c.sft.steps = 300
    c.sft.batch_size = 32
    c.sft.lr = 3e-3
    c.sft.warmup_steps = 20
    c.sft.max_len = 128
    c.sft.stop_acc = 0.0  # > 0: stop the warm-up once accuracy at the rollout temperature
    c.sft.check_every = 100  # ... on sft.check_prompts RL prompts reaches it (checked this often)
    c.sft.check_prompts = 64

    c.mesh = config_dict.ConfigDict()
    c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 = fill with the remaining devices
    return c

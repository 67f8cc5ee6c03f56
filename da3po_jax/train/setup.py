"""Building a run's pieces from its config: tokenizer, policy model, datasets, prompts."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil

import jax

from da3po_jax.data import (
    FieldSpec,
    MathProblem,
    corpus,
    generate_split,
    load_problems,
)
from da3po_jax.models import ModelConfig, Transformer, get_preset, init_model, load_model
from da3po_jax.models.config import RUNTIME_FIELDS
from da3po_jax.models.tokenizer import Tokenizer, build_bpe_tokenizer
from da3po_jax.parallel import param_sharding
from da3po_jax.sampling import GenerateConfig
from da3po_jax.sampling.host import render_question

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Datasets:
    train: list[MathProblem]
    heldout: list[MathProblem]
    sft: list[MathProblem]


def tokenizer_for(cfg, workdir: str, staging: str | None = None) -> Tokenizer:
    """The run's tokenizer: the tiny BPE built into the workdir, or a folder's.

    With `staging`, a tiny tokenizer the workdir lacks is built there instead, so that a
    run refused later writes nothing; `install_tokenizer` moves it into the workdir.
    """
    if cfg.tokenizer.build_tiny:
        path = os.path.join(workdir, "tokenizer")
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return Tokenizer.load(path)
        if staging is not None:
            build_bpe_tokenizer(
                os.path.join(staging, "tokenizer"),
                corpus(900, seed=0, template=cfg.data.template),
                vocab_size=cfg.tokenizer.vocab_size,
            )
            return Tokenizer.load(os.path.join(staging, "tokenizer"))
        install_tokenizer(cfg, workdir)
        return Tokenizer.load(path)
    path = cfg.tokenizer.path or cfg.model.path
    if not path:
        raise ValueError(
            "config.tokenizer.path (or config.model.path) must name a tokenizer "
            "folder unless config.tokenizer.build_tiny is set"
        )
    return Tokenizer.load(path)


def tokenizer_dir(cfg, workdir: str) -> str:
    """The folder holding the run's tokenizer files (copied next to every exported model):
    the tiny BPE in `<workdir>/tokenizer`, else `tokenizer.path` or `model.path`."""
    if cfg.tokenizer.build_tiny:
        return os.path.join(workdir, "tokenizer")
    return cfg.tokenizer.path or cfg.model.path


def install_tokenizer(cfg, workdir: str, staging: str | None = None) -> None:
    """Puts the tiny tokenizer into `<workdir>/tokenizer` (copied from `staging`, where
    `tokenizer_for` built it, or built now) unless it is there already."""
    path = os.path.join(workdir, "tokenizer")
    if not cfg.tokenizer.build_tiny or os.path.isfile(os.path.join(path, "tokenizer.json")):
        return
    # deterministic, so every process of a multi-host run may build it; the first
    # rename wins and the others drop their copy
    tmp = f"{path}.tmp{jax.process_index()}"
    shutil.rmtree(tmp, ignore_errors=True)
    src = os.path.join(staging, "tokenizer") if staging else None
    if src and os.path.isfile(os.path.join(src, "tokenizer.json")):
        shutil.copytree(src, tmp)
    else:
        build_bpe_tokenizer(
            tmp,
            corpus(900, seed=0, template=cfg.data.template),
            vocab_size=cfg.tokenizer.vocab_size,
        )
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def generate_configs(cfg, tokenizer: Tokenizer) -> tuple[GenerateConfig, GenerateConfig]:
    """(rollout, eval) sampling settings of the run: G samples at the rollout temperature,
    and `eval.num_samples` at the eval temperature / top-p (top-k as in the rollout)."""
    rollout = GenerateConfig(
        num_samples=cfg.rollout.group_size,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_k=cfg.rollout.top_k,
        top_p=cfg.rollout.top_p,
        stop_ids=tokenizer.eos_ids,
        pad_id=tokenizer.pad_id,
    )
    evaluation = rollout.replace(
        num_samples=cfg.eval.num_samples,
        temperature=cfg.eval.temperature,
        top_p=cfg.eval.top_p,
        max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
    )
    return rollout, evaluation


def policy_model(
    cfg,
    tokenizer: Tokenizer,
    path: str | None = None,
    mesh=None,
    *,
    preset: str | None = None,
    seed: int | None = None,
) -> Transformer:
    """Loads `path` (or config.model.path) or builds the preset (config.model.preset unless
    `preset`) with random weights from `seed` (config.seed unless given); with `mesh`, every
    parameter is created or read straight into its shards (`parallel.RULES`).
    """
    sharding = param_sharding(mesh) if mesh is not None else None
    path = path or (None if preset else cfg.model.path)
    if path:
        log.info("loading %s", path)
        with tensor_bar(os.path.basename(os.path.normpath(path))) as progress:
            model = load_model(
                path, sharding=sharding, progress=progress, **_runtime_overrides(cfg)
            )
    else:
        model = init_model(
            policy_config(cfg, tokenizer, preset=preset),
            seed=cfg.seed if seed is None else seed,
            sharding=sharding,
        )
    if model.cfg.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"the model's vocab_size={model.cfg.vocab_size} is smaller than the "
            f"tokenizer's {tokenizer.vocab_size}"
        )
    return model


@contextlib.contextmanager
def tensor_bar(name: str):
    """A `progress(done, total)` callback for `load_model` that draws a bar over the
    tensors read (process 0 only; gone once the model is loaded)."""
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(
                total=total,
                desc=f"loading {name}",
                unit="tensor",
                leave=False,
                dynamic_ncols=True,
                disable=not is_main_process(),
            )
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def policy_config(
    cfg, tokenizer: Tokenizer, path: str | None = None, *, preset: str | None = None
) -> ModelConfig:
    """The architecture `policy_model` builds, without building it: `path`'s (or
    config.model.path's) config.json, else the preset sized to the tokenizer's vocabulary;
    the run's runtime fields (dtypes, remat, `scan_layers`, ...) override either. Shapes
    of a checkpointed policy come from here (e.g. to restore only its parameters)."""
    path = path or (None if preset else cfg.model.path)
    if path:
        return ModelConfig.from_hf_folder(path, **_runtime_overrides(cfg))
    vocab = -(-tokenizer.vocab_size // 8) * 8  # a random model takes the tokenizer vocab
    return get_preset(preset or cfg.model.preset, vocab_size=vocab, **_runtime_overrides(cfg))


def _runtime_overrides(cfg) -> dict:
    return {k: cfg.model[k] for k in RUNTIME_FIELDS}


def _fields(cfg) -> FieldSpec:
    kwargs = dict(answer_mode=cfg.data.answer_mode, dedupe=cfg.data.dedupe)
    if cfg.data.prompt_field:
        kwargs["prompt"] = cfg.data.prompt_field
    if cfg.data.answer_field:
        kwargs["answer"] = cfg.data.answer_field
    return FieldSpec(**kwargs)


def load_datasets(cfg) -> Datasets:
    """Train / held-out / SFT problems for `cfg.data.source`."""
    d = cfg.data
    if d.source == "synthetic":
        split = lambda name, n: generate_split(name, n, seed=cfg.seed) if n else []
        return Datasets(
            split("train", d.synthetic_train),
            split("heldout", d.synthetic_eval),
            split("sft", d.synthetic_sft),
        )
    if d.source == "tfds":
        if not d.tfds_name:
            raise ValueError("config.data.tfds_name is required for data.source='tfds'")
        train = load_problems(f"tfds:{d.tfds_name}", _fields(cfg), split="train").problems
        heldout = load_problems(f"tfds:{d.tfds_name}", _fields(cfg), split=d.eval_split).problems
        return Datasets(train, heldout, train)
    train = load_problems(d.train_path, _fields(cfg)).problems
    heldout = load_problems(d.eval_path, _fields(cfg)).problems if d.eval_path else []
    return Datasets(train, heldout, train)


def prompt_renderer(cfg, tokenizer: Tokenizer):
    """problem -> the exact text the policy sees (template, then chat template)."""
    system = cfg.tokenizer.system_prompt or None

    def render(problem: MathProblem) -> str:
        return render_question(tokenizer, problem.prompt, cfg.data.template, system)

    return render


def scorer_kwargs(cfg) -> dict:
    """`RewardScorer`'s arguments from the config's `reward` section."""
    r = cfg.reward
    return dict(
        num_workers=max(r.num_workers, 1),
        timeout_s=r.timeout_s,
        correct_reward=r.correct,
        incorrect_reward=r.incorrect,
        verifier=r.verifier,
    )


def is_main_process() -> bool:
    return jax.process_index() == 0

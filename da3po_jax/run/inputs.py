"""A run's inputs, built from its settings: the tokenizer, the policy model (loaded or
random), the datasets, the prompt renderer and the reward scorer's arguments."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

import jax

from da3po_jax.config import (
    DataSettings,
    ModelSettings,
    RewardSettings,
    Settings,
)
from da3po_jax.data import (
    TIERS,
    FieldSpec,
    MathProblem,
    corpus,
    generate_split,
    load_problems,
)
from da3po_jax.data.suites import TEMPLATE_KEY, EvalSuite, LoadedSuite, describe, load_suite
from da3po_jax.models import ModelConfig, Transformer, get_preset, init_model, load_model
from da3po_jax.models.tokenizer import Tokenizer, build_bpe_tokenizer
from da3po_jax.parallel import is_main_process, param_sharding
from da3po_jax.sampling import GenerateConfig
from da3po_jax.sampling.host import render_question

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Datasets:
    """A run's problems: RL prompts, the held-out set, SFT examples and the evaluation
    suites (`eval.suites`), each with its own problems."""

    train: list[MathProblem]
    heldout: list[MathProblem]
    sft: list[MathProblem]
    suites: tuple[LoadedSuite, ...] = ()


def tokenizer_for(settings: Settings, workdir: str, staging: str | None = None) -> Tokenizer:
    """The run's tokenizer: the tiny BPE built into the workdir, or a folder's.

    With `staging`, a tiny tokenizer the workdir lacks is built there instead, so that a
    run refused later writes nothing; `install_tokenizer` moves it into the workdir.
    """
    if settings.tokenizer.build_tiny:
        path = os.path.join(workdir, "tokenizer")
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return Tokenizer.load(path)
        if staging is not None:
            _build_tiny_tokenizer(settings, os.path.join(staging, "tokenizer"))
            return Tokenizer.load(os.path.join(staging, "tokenizer"))
        install_tokenizer(settings, workdir)
        return Tokenizer.load(path)
    return Tokenizer.load(tokenizer_dir(settings, workdir))


def _build_tiny_tokenizer(settings: Settings, path: str) -> None:
    corpus_texts = corpus(900, seed=0, template=settings.data.template)
    build_bpe_tokenizer(path, corpus_texts, vocab_size=settings.tokenizer.vocab_size)


def tokenizer_dir(settings: Settings, workdir: str) -> str:
    """The folder holding the run's tokenizer files (copied next to every exported model):
    the tiny BPE in `<workdir>/tokenizer`, else `tokenizer.path` or `model.path`."""
    if settings.tokenizer.build_tiny:
        return os.path.join(workdir, "tokenizer")
    return settings.tokenizer.path or settings.model.path


def install_tokenizer(settings: Settings, workdir: str, staging: str | None = None) -> None:
    """Puts the tiny tokenizer into `<workdir>/tokenizer` (copied from `staging`, where
    `tokenizer_for` built it, or built now) unless it is there already."""
    path = os.path.join(workdir, "tokenizer")
    if not settings.tokenizer.build_tiny or os.path.isfile(os.path.join(path, "tokenizer.json")):
        return
    # deterministic, so every process of a multi-host run may build it; the first
    # rename wins and the others drop their copy
    tmp = f"{path}.tmp{jax.process_index()}"
    shutil.rmtree(tmp, ignore_errors=True)
    src = os.path.join(staging, "tokenizer") if staging else None
    if src and os.path.isfile(os.path.join(src, "tokenizer.json")):
        shutil.copytree(src, tmp)
    else:
        _build_tiny_tokenizer(settings, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isfile(os.path.join(path, "tokenizer.json")):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def generate_configs(
    settings: Settings, tokenizer: Tokenizer
) -> tuple[GenerateConfig, GenerateConfig]:
    """(rollout, eval) sampling settings of the run: G samples at the rollout temperature,
    recording log-probs of the trained policy (`loss.temperature`), and `eval.num_samples`
    at the eval temperature / top-p (top-k as in the rollout; its log-probs unused)."""
    rollout = settings.rollout
    train_gen = GenerateConfig(
        num_samples=rollout.group_size,
        max_new_tokens=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_k=rollout.top_k,
        top_p=rollout.top_p,
        policy_temperature=settings.loss.temperature,
        stop_ids=tokenizer.eos_ids,
        pad_id=tokenizer.pad_id,
        gather_weights=rollout.gather_weights,
    )
    eval_gen = train_gen.replace(
        num_samples=settings.eval.num_samples,
        temperature=settings.eval.temperature,
        top_p=settings.eval.top_p,
        policy_temperature=1.0,
        max_new_tokens=settings.eval_max_new_tokens,
    )
    return train_gen, eval_gen


def policy_model(
    model: ModelSettings,
    tokenizer: Tokenizer,
    *,
    seed: int,
    path: str | None = None,
    mesh=None,
    preset: str | None = None,
    teacher: bool = False,
) -> Transformer:
    """Loads `path` (or `model.path`) or builds the preset (`model.preset` unless `preset`)
    with random weights from `seed`; with `mesh`, every parameter is created or read
    straight into its shards (`parallel.RULES`). The run's runtime fields (dtypes, remat,
    attention, layer scan) apply either way, its context extension to the policy only
    (not with `teacher`).
    """
    sharding = param_sharding(mesh) if mesh is not None else None
    path = path or (None if preset else model.path)
    if path:
        log.info("loading %s", path)
        with tensor_bar(os.path.basename(os.path.normpath(path))) as progress:
            policy = load_model(
                path, sharding=sharding, progress=progress, **model_overrides(model, teacher)
            )
    else:
        model_config = policy_config(model, tokenizer, preset=preset, teacher=teacher)
        policy = init_model(model_config, seed=seed, sharding=sharding)
    if policy.config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"the model's vocab_size={policy.config.vocab_size} is smaller than the "
            f"tokenizer's {tokenizer.vocab_size}"
        )
    return policy


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


def model_overrides(model: ModelSettings, teacher: bool = False) -> dict[str, Any]:
    """The `ModelConfig` fields the run sets over a checkpoint's or preset's: the runtime
    fields, and the policy's context extension (not the teacher's)."""
    return model.runtime_fields() | ({} if teacher else model.context_fields())


def policy_config(
    model: ModelSettings,
    tokenizer: Tokenizer,
    path: str | None = None,
    *,
    preset=None,
    teacher: bool = False,
) -> ModelConfig:
    """The architecture `policy_model` builds, without building it: `path`'s (or
    `model.path`'s) config.json, else the preset sized to the tokenizer's vocabulary;
    the run's runtime fields (dtypes, remat, `scan_layers`, ...) override either, and the
    policy's context extension (`model.max_position_embeddings`, `model.rope_theta`)
    unless it is the `teacher`. Shapes of a checkpointed policy come from here (e.g. to
    restore only its parameters)."""
    path = path or (None if preset else model.path)
    overrides = model_overrides(model, teacher)
    if path:
        return ModelConfig.from_hf_folder(path, **overrides)
    vocab = preset_vocab(tokenizer.vocab_size)
    return get_preset(preset or model.preset, vocab_size=vocab, **overrides)


def preset_vocab(tokenizer_vocab: int) -> int:
    """The vocabulary of a random-init policy: the tokenizer's, rounded up to 8."""
    return -(-tokenizer_vocab // 8) * 8


def _fields(d: DataSettings) -> FieldSpec:
    kwargs = dict(answer_mode=d.answer_mode, dedupe=d.dedupe)
    if d.prompt_field:
        kwargs["prompt"] = d.prompt_field
    if d.answer_field:
        kwargs["answer"] = d.answer_field
    return FieldSpec(**kwargs)


def load_datasets(d: DataSettings, seed: int, suites: Sequence[EvalSuite] = ()) -> Datasets:
    """Train / held-out / SFT problems for `d.source` (synthetic splits from `seed`), and
    the problems of the evaluation `suites` (`Settings.eval_suites`)."""
    data = _splits(d, seed)
    data.suites = tuple(_load_suite(suite, d) for suite in suites)
    return data


def _load_suite(suite: EvalSuite, d: DataSettings) -> LoadedSuite:
    """A suite's problems; one without a known format reads the run's field settings and
    gets the run's template."""
    loaded = load_suite(suite, _fields(d), d.template)
    log.info("eval suite %s", describe(loaded))
    return loaded


def _splits(d: DataSettings, seed: int) -> Datasets:
    if d.source == "synthetic":
        weights = dict(zip(TIERS, d.synthetic_tier_weights))

        def split(name: str, n: int) -> list[MathProblem]:
            return generate_split(name, n, seed=seed, tier_weights=weights) if n else []

        return Datasets(
            split("train", d.synthetic_train),
            split("heldout", d.synthetic_eval),
            split("sft", d.synthetic_sft),
        )
    if d.source == "tfds":
        if not d.tfds_name:
            raise ValueError("config.data.tfds_name is required for data.source='tfds'")
        train = load_problems(f"tfds:{d.tfds_name}", _fields(d), split="train").problems
        heldout = load_problems(f"tfds:{d.tfds_name}", _fields(d), split=d.eval_split).problems
        return Datasets(train, heldout, train)
    train = load_problems(d.train_path, _fields(d)).problems
    heldout = load_problems(d.eval_path, _fields(d)).problems if d.eval_path else []
    return Datasets(train, heldout, train)


def prompt_renderer(settings: Settings, tokenizer: Tokenizer):
    """problem -> the exact text the policy sees (template, then chat template)."""
    system = settings.tokenizer.system_prompt or None

    def render(problem: MathProblem) -> str:
        template = problem.meta.get(TEMPLATE_KEY) or settings.data.template  # a suite's own
        return render_question(tokenizer, problem.prompt, template, system)

    return render


def scorer_kwargs(reward: RewardSettings) -> dict:
    """`RewardScorer`'s arguments from the `reward` settings."""
    return dict(
        num_workers=max(reward.num_workers, 1),
        timeout_s=reward.timeout_s,
        correct_reward=reward.correct,
        incorrect_reward=reward.incorrect,
        verifier=reward.verifier,
        fallback=reward.fallback,
    )

"""Every check that can refuse a training run, in one pass before its first byte is
written (`validate_run`): the workdir's layout, its checkpoints (configuration and data),
the devices the settings split work over, the policy's context (prompt + response
positions) and the teacher's files. Settings are checked
when resolved (`config.resolve_settings`); data, tokenizer and model files when read.

The order of a run's start (`run.job.train`): settings -> the workdir path -> mesh ->
tokenizer (in a staging folder) -> data, with prompts longer than the largest bucket
dropped (`usable_prompts`) -> `validate_run` -> policy weights -> the workdir lock ->
the first write. Only a damaged checkpoint is found later (reading it means building
the run), and a refusal then still leaves the workdir as it was.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from jax.sharding import Mesh

from da3po_jax.config import Settings
from da3po_jax.data import MathProblem, PromptIterator
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel.mesh import batch_size_divisor
from da3po_jax.rollout import PromptEncoder
from da3po_jax.run.inputs import Datasets, policy_config
from da3po_jax.run.loop import check_same_data
from da3po_jax.run.model_shapes import check_context, model_origin
from da3po_jax.run.teacher import check_same_tokenizer
from da3po_jax.runtime.checkpoint import Checkpointer, check_compatible, check_directory
from da3po_jax.runtime.metrics_file import read_metrics

log = logging.getLogger(__name__)

REPORTED = 5  # over-long prompts named one by one, per split


def workdir_path(workdir: str) -> str:
    """The absolute workdir; an empty one (`--workdir=`) is refused rather than taken as
    the current folder."""
    if not str(workdir).strip():
        raise ValueError("--workdir is empty: name the run's folder, e.g. --workdir=/tmp/run")
    return os.path.abspath(workdir)


def usable_prompts(data: Datasets, encoder: PromptEncoder) -> Datasets:
    """`data` without the training, held-out and suite prompts longer than the largest
    prompt bucket (`rollout.prompt_buckets`): skipped and counted like malformed rows, the
    first few named (file and row id). Refused only when a split or suite that had
    prompts has none left.
    """
    kept = {split: _fitting(getattr(data, split), split, encoder) for split in ("train", "heldout")}
    suites = tuple(
        dataclasses.replace(s, problems=_fitting(s.problems, f"eval suite {s.suite.name}", encoder))
        for s in data.suites
    )
    return Datasets(kept["train"], kept["heldout"], data.sft, suites)


def _fitting(problems: list[MathProblem], split: str, encoder: PromptEncoder) -> list[MathProblem]:
    """The problems of `split` whose prompt fits the largest bucket (see `usable_prompts`)."""
    limit = max(encoder.buckets)
    fit = [p for p in problems if len(encoder.ids(p)) <= limit]
    dropped = [p for p in problems if len(encoder.ids(p)) > limit]
    if dropped:
        named = ", ".join(
            f"{p.source or 'synthetic'} row {p.id!r} ({len(encoder.ids(p))} tokens)"
            for p in dropped[:REPORTED]
        )
        log.warning(
            "%s data: skipped %d of %d prompts longer than the largest prompt bucket, "
            "%d tokens (rollout.prompt_buckets): %s%s",
            split,
            len(dropped),
            len(problems),
            limit,
            named,
            ", ..." if len(dropped) > REPORTED else "",
        )
    if problems and not fit:
        raise ValueError(
            f"every one of the {len(problems)} {split} prompts is longer than the largest "
            f"prompt bucket, {limit} tokens (rollout.prompt_buckets), e.g. "
            f"{dropped[0].source or 'synthetic'} row {dropped[0].id!r} "
            f"({len(encoder.ids(dropped[0]))} tokens)"
        )
    return fit


def validate_run(
    settings: Settings,
    workdir: str,
    mesh: Mesh,
    tokenizer: Tokenizer,
    data: Datasets,
    encoder: PromptEncoder,
) -> None:
    """Refuses a run that cannot go on, naming the problem; writes nothing.

    Raises:
      ValueError / OSError / CheckpointError: the first problem found.
    """
    check_workdir(settings, workdir, data)
    check_devices(settings, mesh)
    check_policy_context(settings, tokenizer, data, encoder)
    check_teacher(settings, tokenizer, [encoder.render(p) for p in data.train[:2]])


def check_policy_context(
    settings: Settings, tokenizer: Tokenizer, data: Datasets, encoder: PromptEncoder
) -> None:
    """The bucket of the longest training (held-out) prompt + the response (eval) cap fit
    the policy's `max_position_embeddings` (`model_shapes.check_context`); the policy's
    architecture is read from its config.json (or preset), before any weight."""
    if settings.stage == "sft":
        return
    path = settings.model.init_checkpoint or settings.model.path or None
    model_config = policy_config(settings.model, tokenizer, path)
    where = model_origin(settings.model, path)
    train = encoder.bucket(data.train) if data.train else 0
    evaluated = data.heldout + [p for s in data.suites for p in s.problems]
    heldout = encoder.bucket(evaluated) if evaluated else 0
    check_context(settings, model_config, train, heldout, where)


def check_workdir(settings: Settings, workdir: str, data: Datasets | None = None) -> None:
    """Refuses a workdir the run cannot use: a file where a folder must be, or checkpoints
    written by an incompatible configuration or for other training data."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"--workdir {workdir!r} exists and is not a folder")
    check_directory(os.path.join(workdir, "checkpoints"), "checkpoints")
    for name in ("metrics.jsonl", "config.json", "summary.json"):
        if os.path.isdir(os.path.join(workdir, name)):
            raise IsADirectoryError(f"{os.path.join(workdir, name)!r} is a folder, not a file")
    if settings.stage == "sft" or not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return
    checkpointer = Checkpointer(workdir, settings.train.keep_checkpoints)
    try:
        newest = checkpointer.newest_host()
    finally:
        checkpointer.close()
    if newest is not None:
        host = newest[1]
        check_compatible(host.get("config", {}), settings.fingerprint(), checkpointer.directory)
        if data is not None:
            iterator = PromptIterator(data.train, seed=settings.seed)  # as `build_trainer` makes it
            check_same_data(host.get("data"), iterator, checkpointer.directory)
    read_metrics(os.path.join(workdir, "metrics.jsonl"))  # a malformed row is named now


def check_devices(settings: Settings, mesh: Mesh) -> None:
    """The settings that split work over the mesh's batch devices (data x fsdp)."""
    devices = batch_size_divisor(mesh)
    rollout = settings.rollout
    if rollout.engine == "continuous" and rollout.slots % devices:
        raise ValueError(
            f"config.rollout.slots={rollout.slots} must be a multiple of the {devices} devices "
            f"a batch is split over (mesh {dict(mesh.shape)})"
        )
    if settings.rl.packing and settings.rl.pack_rows % devices:
        raise ValueError(
            f"config.rl.pack_rows={settings.rl.pack_rows} must be a multiple of the "
            f"{devices} devices "
            f"a batch is split over (mesh {dict(mesh.shape)})"
        )


def check_teacher(settings: Settings, tokenizer: Tokenizer, probes: list[str]) -> None:
    """OPD / RA-OPD: `teacher.path` must hold a model with the student's tokenizer, unless
    the run builds it there (`teacher.sft_steps`, when the folder has no model yet)."""
    teacher = settings.teacher
    if not settings.distillation or not teacher.path:
        return
    if os.path.isfile(os.path.join(teacher.path, "config.json")):
        check_same_tokenizer(tokenizer, teacher.path, probes)
    elif not teacher.sft_steps:
        what = "holds no config.json" if os.path.isdir(teacher.path) else "does not exist"
        raise FileNotFoundError(
            f"config.teacher.path={teacher.path!r} {what} (a HF model folder); set "
            "config.teacher.sft_steps to build a tiny teacher there"
        )

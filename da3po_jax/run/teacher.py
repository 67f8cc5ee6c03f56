"""The frozen teacher of on-policy distillation (OPD / RA-OPD): loading it, building a
tiny one by a longer SFT warm start, and the checks that it speaks the student's
tokenizer.

OPD compares log-probs of the *same token ids* under student and teacher, so the two must
share a tokenizer exactly (same vocabulary, same encodings); the teacher's embedding may be
larger than the student's (padded vocabularies) but not smaller.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

from da3po_jax.config import Settings
from da3po_jax.models import Transformer
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.run.context import RunContext
from da3po_jax.run.inputs import policy_model
from da3po_jax.run.warm_start import sft_warm_start

log = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
_PROBES = (
    "What is 17 + 25? Answer: 42.",
    "Let x = 3.5 and y = -4; then x*y = -14. \\boxed{-14}",
    "  leading spaces, tabs\tand\nnew lines; unicode: é, π, 数学.",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
)


def check_same_tokenizer(student: Tokenizer, path: str, probes: Sequence[str] = ()) -> None:
    """Raises unless the tokenizer saved in folder `path` (if any) equals the student's.

    Compares the vocabulary size, the whole token -> id table, and the encodings of a few
    probe texts (plus `probes`, e.g. rendered prompts). A folder without tokenizer files is
    accepted with a warning (only the model's vocabulary size can then be checked).

    Raises:
      ValueError: naming the first difference.
    """
    if not any(os.path.isfile(os.path.join(path, f)) for f in _TOKENIZER_FILES):
        log.warning("teacher folder %s has no tokenizer files; assuming the student's", path)
        return
    teacher = Tokenizer.load(path)
    where = f"teacher tokenizer in {path!r}"
    if teacher.vocab_size != student.vocab_size:
        raise ValueError(
            f"{where} has vocab size {teacher.vocab_size}, the student's has "
            f"{student.vocab_size}: OPD needs the student's tokenizer (config.teacher.path)"
        )
    t_vocab, s_vocab = teacher.hf.get_vocab(), student.hf.get_vocab()
    if t_vocab != s_vocab:
        diff = sorted(k for k in set(t_vocab) | set(s_vocab) if t_vocab.get(k) != s_vocab.get(k))
        tok = diff[0]
        raise ValueError(
            f"{where} differs from the student's: token {tok!r} has id {t_vocab.get(tok)} "
            f"there and {s_vocab.get(tok)} in the student's ({len(diff)} tokens differ)"
        )
    for text in (*_PROBES, *probes):
        a, b = teacher.encode([text])[0], student.encode([text])[0]
        if a != b:
            raise ValueError(
                f"{where} encodes {text[:60]!r} as {a[:12]}..., the student's as {b[:12]}...: "
                "OPD needs the same tokenizer"
            )


def load_teacher(
    settings: Settings,
    tokenizer: Tokenizer,
    student: Transformer,
    mesh=None,
    probes: Sequence[str] = (),
) -> Transformer:
    """The frozen teacher: `teacher.path` (tokenizer checked against the student's) or a
    random-init `teacher.preset` with seed `teacher.seed`, with the policy's runtime
    settings (dtypes, remat, ...), its parameters created or read straight into the
    student's sharded layout on `mesh`.

    Raises:
      ValueError: different tokenizer, or a teacher vocabulary smaller than the student's.
    """
    teacher_settings = settings.teacher
    if teacher_settings.path:
        if not os.path.isfile(os.path.join(teacher_settings.path, "config.json")):
            raise FileNotFoundError(
                f"config.teacher.path={teacher_settings.path!r} holds no config.json (a HF "
                "model folder); set config.teacher.sft_steps to build a tiny teacher there"
            )
        check_same_tokenizer(tokenizer, teacher_settings.path, probes)
        teacher = policy_model(
            settings.model,
            tokenizer,
            seed=settings.seed,
            path=teacher_settings.path,
            mesh=mesh,
            teacher=True,
        )
    else:
        teacher = policy_model(
            settings.model,
            tokenizer,
            seed=teacher_settings.seed,
            mesh=mesh,
            preset=teacher_settings.preset,
            teacher=True,
        )
    if teacher.config.vocab_size < student.config.vocab_size:
        raise ValueError(
            f"the teacher's vocab_size={teacher.config.vocab_size} (config.teacher."
            f"{'path' if teacher_settings.path else 'preset'}) is smaller than the student's "
            f"{student.config.vocab_size}: sampled ids could fall outside the teacher's vocabulary"
        )
    log.info(
        "teacher: %s (%d layers, hidden %d, vocab %d)",
        teacher_settings.path or f"preset {teacher_settings.preset} seed {teacher_settings.seed}",
        teacher.config.num_layers,
        teacher.config.hidden_size,
        teacher.config.vocab_size,
    )
    return teacher


def build_teacher(ctx: RunContext) -> None:
    """Builds a missing `teacher.path` by an SFT warm start of `teacher.sft_steps` steps
    (stopping at `teacher.sft_stop_acc`): the tiny demo's teacher is the student's model
    trained longer. Built once and reused by every run that points at the folder."""
    settings = ctx.settings
    teacher = settings.teacher
    if (
        teacher.path
        and teacher.sft_steps
        and not os.path.isfile(os.path.join(teacher.path, "config.json"))
    ):
        log.info("teacher: building %s by up to %d SFT steps", teacher.path, teacher.sft_steps)
        sft = dataclasses.replace(
            settings.sft, steps=teacher.sft_steps, stop_acc=teacher.sft_stop_acc
        )
        build = ctx.replace(settings=settings.replace(sft=sft))
        model = policy_model(
            settings.model, ctx.tokenizer, seed=settings.seed, mesh=ctx.mesh, teacher=True
        )
        sft_warm_start(build, model, teacher.path, "teacher_logs")

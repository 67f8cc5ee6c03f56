"""Quick sampling check: `python -m da3po_jax.sample --model=DIR --prompt="What is 2+3?"`.

Loads a Hugging Face model folder, renders each `--prompt` (under the training prompt
`--template` when given, then the tokenizer's chat template when it has one) and prints
`--num_samples` responses per prompt. `--dtype` and `--mesh` take the values of the
training config's `model.dtype` and `mesh.shape`.

Every argument is checked before the weights are read: the flags' ranges, the model folder
and its config.json, the tokenizer folder, and that the longest rendered prompt plus
`--max_new_tokens` fits the model's `max_position_embeddings`.

Exit status: 0 once the samples are printed; 1 on an error: a `--dtype`, `--template` or
`--mesh` that absl refuses while parsing the flags (`FATAL Flags parsing error: flag
--dtype=...`), or any other, whose traceback is followed by one last line
`da3po_jax: error: ...` naming the problem (the flag, or the file).
"""

from __future__ import annotations

import sys

from absl import app, flags

_MODEL = flags.DEFINE_string("model", None, "Hugging Face model folder.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer folder (default: --model).")
_PROMPT = flags.DEFINE_multi_string("prompt", None, "Prompt text; repeat for several.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Samples per prompt.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 256, "Response length cap.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "0 = greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens; 0 = off.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass; 1.0 = off.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_DTYPE = flags.DEFINE_string(
    "dtype",
    None,
    "Parameter and compute dtype (config.model.param_dtype / dtype): float32, bfloat16 or "
    "float16; default: float32.",
)
_TEMPLATE = flags.DEFINE_string(
    "template",
    None,
    "Training prompt template (config.data.template): dapo, boxed, tiny, raw or a string "
    "with {problem}; default: none, the prompt goes to the chat template as it is.",
)
_MESH = flags.DEFINE_string(
    "mesh",
    None,
    "Device mesh (data, fsdp, tensor) as config.mesh.shape, e.g. 1,-1,1 (-1 = the remaining "
    "devices); default: training's -1,1,1, data parallel over every local device.",
)
flags.mark_flags_as_required(["model", "prompt"])


def _checked(check):
    """An absl validator from a host check that raises ValueError (None = flag unset)."""

    def validate(value) -> bool:
        if value is None:
            return True
        from da3po_jax.sampling import host  # imported only when the flag is set

        try:
            getattr(host, check)(value)
        except ValueError as e:
            raise flags.ValidationError(str(e)) from None
        return True

    return validate


flags.register_validator("dtype", _checked("check_dtype"))
flags.register_validator("template", _checked("check_template"))
flags.register_validator("mesh", _checked("parse_mesh_shape"))


def main(argv: list[str]) -> None:
    """The command: prints the samples, and ends with exit status 1 and a last stderr line
    naming the problem on any error."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from da3po_jax.runtime.signals import run_reporting_errors  # after flags: fast --help

    code = run_reporting_errors(_sample)
    if code is not None:
        sys.stdout.flush()
        sys.exit(code)


def _sample() -> None:
    """Samples and prints; a refused argument is named as its flag (`--max_new_tokens=...`)."""
    from da3po_jax.sampling.host import DEFAULT_MESH_SHAPE, ArgumentError, sample_from_folder

    try:
        result = sample_from_folder(
            _MODEL.value,
            _PROMPT.value,
            tokenizer_path=_TOKENIZER.value,
            seed=_SEED.value,
            dtype=_DTYPE.value,
            template=_TEMPLATE.value,
            mesh_shape=_MESH.value or DEFAULT_MESH_SHAPE,
            num_samples=_NUM_SAMPLES.value,
            max_new_tokens=_MAX_NEW_TOKENS.value,
            temperature=_TEMPERATURE.value,
            top_k=_TOP_K.value,
            top_p=_TOP_P.value,
        )
    except ArgumentError as e:
        raise ValueError(f"--{e.name}={e.value}: {e.problem}") from None
    for prompt, texts, lengths in zip(_PROMPT.value, result.texts, result.output.lengths):
        print(f"=== prompt: {prompt!r}")
        for g, (text, n) in enumerate(zip(texts, lengths)):
            print(f"--- sample {g} ({int(n)} tokens)\n{text}")


if __name__ == "__main__":
    app.run(main)

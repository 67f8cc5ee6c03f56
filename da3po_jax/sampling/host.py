"""Host side of sampling: text prompts -> a length bucket -> `Sampler` -> decoded text.

Everything variable-length lives here: prompts are rendered (optionally a training prompt
template, then the chat template when the tokenizer has one), tokenised, left-padded to the
smallest bucket that fits the longest and, when a fixed number of prompts per call is asked
for (or a mesh needs a multiple of its batch devices), topped up with one-token filler
prompts whose outputs are dropped. The device only sees fixed shapes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from da3po_jax.data.prompts import format_prompt, get_template
from da3po_jax.models.config import DTYPE_NAMES, ModelConfig
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.parallel import make_mesh, param_sharding, resolve_mesh_shape, shard_batch
from da3po_jax.parallel.mesh import batch_size_divisor
from da3po_jax.sampling.sampler import GenerateConfig, SampleOutput, Sampler

DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Training's default `config.mesh.shape`: data parallel over every device, weights replicated.
DEFAULT_MESH_SHAPE = (-1, 1, 1)
# The range of each numeric `GenerateConfig` field, as `check_generate_kwargs` checks it.
_GENERATE_RANGES = {
    "num_samples": (lambda v: v >= 1, ">= 1"),
    "max_new_tokens": (lambda v: v >= 1, ">= 1"),
    "temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    "top_k": (lambda v: v >= 0, ">= 0 (0 = off)"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1] (1 = off)"),
}


class ArgumentError(ValueError):
    """A refused argument of `sample_from_folder`, named as the keyword (which is also the
    flag of `python -m da3po_jax.sample`).

    Attributes:
      name: the keyword argument.
      value: the value refused.
      problem: why, and what is allowed.
    """

    def __init__(self, name: str, value: Any, problem: str):
        super().__init__(f"{name}={value}: {problem}")
        self.name, self.value, self.problem = name, value, problem


def check_dtype(dtype: str) -> str:
    """`dtype` if it is one of `DTYPE_NAMES` (as `ModelConfig` checks its dtype fields).

    Raises:
      ValueError: naming the value and the allowed ones.
    """
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype={dtype!r}; expected one of {list(DTYPE_NAMES)}")
    return dtype


def check_template(template: str) -> str:
    """`template` if training accepts it as `config.data.template`: a built-in name or a
    string with `{problem}` (`data.prompts.get_template`, whose error lists the names)."""
    get_template(template)
    return template


def parse_mesh_shape(shape: str | Sequence[int]) -> tuple[int, int, int]:
    """A mesh shape as `config.mesh.shape` takes it ("1,-1,1" or a sequence), with its -1
    filled for this process's devices (`parallel.resolve_mesh_shape`).

    Raises:
      ValueError: not three integers, or not a valid shape for the device count.
    """
    if isinstance(shape, str):
        try:
            shape = tuple(int(s) for s in shape.strip("()[] ").split(","))
        except ValueError:
            raise ValueError(
                f"mesh shape {shape!r} is not comma-separated integers (data, fsdp, tensor), "
                "e.g. '1,-1,1'"
            ) from None
    return resolve_mesh_shape(shape, jax.device_count())


def check_generate_kwargs(kwargs: Mapping[str, Any]) -> None:
    """Checks the numeric `GenerateConfig` fields among `kwargs` (num_samples,
    max_new_tokens, temperature, top_k, top_p) against their ranges.

    Raises:
      ArgumentError: naming the first one out of its range, and the range.
    """
    for name, (ok, allowed) in _GENERATE_RANGES.items():
        if name in kwargs and not ok(kwargs[name]):
            raise ArgumentError(name, kwargs[name], f"must be {allowed}")


def read_model_config(path: str) -> ModelConfig:
    """The `ModelConfig` of the model folder `path`, read from its config.json alone.

    Raises:
      FileNotFoundError: no folder `path`, or no config.json in it.
      ValueError: naming the config.json when it is broken (`ModelConfig.from_hf_folder`).
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model folder {path!r} does not exist")
    return ModelConfig.from_hf_folder(path)


def check_room(
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    max_positions: int,
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    template: str | None = None,
) -> int:
    """Encodes `prompts` as `encode_prompts` does (refusing empty prompts and prompts longer
    than every bucket) and returns the longest one's token count, when it plus
    `max_new_tokens` fits the model's `max_positions` (max_position_embeddings).

    Raises:
      ArgumentError: naming max_new_tokens, the longest prompt and the model's limit.
    """
    batch = encode_prompts(tokenizer, prompts, buckets=buckets, template=template)
    longest = int(batch.mask.sum(-1).max())
    if longest + max_new_tokens > max_positions:
        raise ArgumentError(
            "max_new_tokens",
            max_new_tokens,
            f"the longest prompt ({longest} tokens) plus {max_new_tokens} new tokens exceeds "
            f"the model's max_position_embeddings={max_positions}: at most "
            f"{max(max_positions - longest, 0)} new tokens fit",
        )
    return longest


def render_question(
    tokenizer: Tokenizer, question: str, template: str | None = None, system: str | None = None
) -> str:
    """The text the model sees for `question`: the training prompt `template`
    (`format_prompt`; None: the question as it is), then the chat template with `system`.
    Training renders its prompts with this too (`run.inputs.prompt_renderer`)."""
    text = question if template is None else format_prompt(question, template)
    return tokenizer.render_prompt(text, system)


def pick_bucket(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length.

    Raises:
      ValueError: no bucket is long enough.
    """
    fits = [b for b in sorted(buckets) if b >= length]
    if not fits:
        raise ValueError(f"prompt of {length} tokens exceeds the largest bucket {max(buckets)}")
    return fits[0]


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """Prompts ready for `generate`.

    Attributes:
      tokens: [P, Tp] int32, left-padded with the tokenizer's pad id.
      mask: [P, Tp] bool, True on real tokens.
      num_real: how many leading rows are real prompts (the rest are filler).
    """

    tokens: np.ndarray
    mask: np.ndarray
    num_real: int


def encode_prompts(
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    *,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    num_prompts: int | None = None,
    render: bool = True,
    template: str | None = None,
) -> PromptBatch:
    """Renders, tokenises and left-pads `prompts` into one bucket.

    Args:
      tokenizer: the policy's tokenizer.
      prompts: user texts (rendered with the chat template when `render`).
      buckets: allowed prompt lengths; the smallest one that fits the longest prompt wins.
      num_prompts: pad the batch to this many rows (a fixed P per call), or None.
      render: render with `render_question`; False feeds the texts as they are.
      template: training prompt template applied before the chat template (see
        `render_question`); None = none.
    """
    if not prompts:
        raise ValueError("no prompts")
    texts = [render_question(tokenizer, p, template) if render else p for p in prompts]
    ids = tokenizer.encode(texts)
    empty = [i for i, s in enumerate(ids) if not s]
    if empty:
        raise ValueError(f"prompts {empty} are empty after tokenisation")
    rows = len(ids) if num_prompts is None else num_prompts
    if rows < len(ids):
        raise ValueError(f"{len(ids)} prompts do not fit num_prompts={num_prompts}")
    ids = ids + [[tokenizer.pad_id]] * (rows - len(ids))
    tokens, mask = tokenizer.pad_left(ids, pick_bucket(max(map(len, ids)), buckets))
    return PromptBatch(tokens=tokens, mask=mask, num_real=len(prompts))


def config_for(tokenizer: Tokenizer, **kwargs) -> GenerateConfig:
    """A `GenerateConfig` that stops at the tokenizer's EOS ids and pads with its pad id."""
    return GenerateConfig(stop_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, **kwargs)


def decode_responses(
    tokenizer: Tokenizer, tokens: np.ndarray, lengths: np.ndarray
) -> list[list[str]]:
    """Texts of responses tokens [P, G, N] with lengths [P, G], as P lists of G strings."""
    return [
        [tokenizer.decode(row[:n]) for row, n in zip(rows, lens)]
        for rows, lens in zip(np.asarray(tokens), np.asarray(lengths))
    ]


@dataclasses.dataclass(frozen=True)
class TextSamples:
    """Decoded responses and the arrays they came from (real prompts only).

    Attributes:
      texts: P lists of G response strings.
      output: the `SampleOutput` as NumPy arrays, filler rows dropped.
      prompts: the `PromptBatch` that went in.
    """

    texts: list[list[str]]
    output: SampleOutput
    prompts: PromptBatch


def sample_text(
    sampler: Sampler,
    state: nnx.State,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    seed: int | jax.Array,
    *,
    config: GenerateConfig | None = None,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    num_prompts: int | None = None,
    render: bool = True,
    template: str | None = None,
    mesh: Mesh | None = None,
) -> TextSamples:
    """Text in, text out: encode -> `sampler.generate` -> decode.

    Args:
      sampler: the policy's `Sampler` (its config, or `config`, should stop at the
        tokenizer's EOS ids: see `config_for`).
      state: model parameters (`nnx.split(model)[1]`).
      tokenizer: the policy's tokenizer.
      prompts: user texts.
      seed: int seed or PRNG key.
      config: settings for this call (default: the sampler's).
      buckets, num_prompts, render, template: as `encode_prompts`.
      mesh: split the prompts over its batch axes (`parallel.shard_batch`), their number
        rounded up to a multiple of its batch devices with filler prompts; None = as given.
    """
    if mesh is not None:
        per = batch_size_divisor(mesh)
        num_prompts = -(-(num_prompts or len(prompts)) // per) * per
    batch = encode_prompts(
        tokenizer,
        prompts,
        buckets=buckets,
        num_prompts=num_prompts,
        render=render,
        template=template,
    )
    tokens, mask = batch.tokens, batch.mask
    if mesh is not None:
        tokens, mask = shard_batch((tokens, mask), mesh)
    out = sampler.generate(state, tokens, mask, seed, config)
    out = jax.tree.map(
        lambda x: np.asarray(x)[: batch.num_real] if x.ndim else np.asarray(x), jax.device_get(out)
    )
    texts = decode_responses(tokenizer, out.tokens, out.lengths)
    return TextSamples(texts=texts, output=out, prompts=batch)


def load_on_mesh(model_path: str, mesh: Mesh, dtype: str | None = None):
    """Loads a HF model folder with every parameter read straight into its shards on
    `mesh` (`parallel.param_sharding`, as the trainer's `policy_model`), in `dtype`
    (param_dtype and dtype; None = `load_model`'s default, float32)."""
    from da3po_jax.models.hf_io import load_model

    overrides = {} if dtype is None else {"param_dtype": dtype, "dtype": dtype}
    return load_model(model_path, sharding=param_sharding(mesh), **overrides)


def sample_from_folder(
    model_path: str,
    prompts: Sequence[str],
    *,
    tokenizer_path: str | None = None,
    seed: int = 0,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    dtype: str | None = None,
    template: str | None = None,
    mesh_shape: str | Sequence[int] = DEFAULT_MESH_SHAPE,
    **generate_kwargs,
) -> TextSamples:
    """Loads a HF model folder (and its tokenizer) and samples responses to `prompts`.

    Args:
      model_path: folder with config.json and safetensors weights.
      prompts: user texts (questions, under `template`), rendered with the chat template
        when there is one.
      tokenizer_path: tokenizer folder (default: `model_path`).
      seed: PRNG seed.
      buckets: allowed prompt lengths.
      dtype: parameter and compute dtype, one of `DTYPE_NAMES` (config.model.param_dtype and
        config.model.dtype); None = `load_model`'s default (float32).
      template: the training prompt template (`config.data.template`: "dapo", "boxed",
        "tiny", "raw" or a string with `{problem}`) applied to each prompt before the chat
        template; None = the prompt as it is.
      mesh_shape: (data, fsdp, tensor) as `config.mesh.shape` ("1,-1,1" or a sequence, one
        -1 = the remaining devices); the weights are sharded on it by the training rules
        and the prompts split over its batch axes. Default: training's, data parallel
        over every device (one device: unsharded).
      **generate_kwargs: `GenerateConfig` fields (num_samples, max_new_tokens, ...).

    Every argument is checked before the weights are read (config.json and the tokenizer,
    both cheap, first: the longest prompt plus `max_new_tokens` must fit the positions).

    Raises:
      ArgumentError: a generate setting out of its range, or a `max_new_tokens` beyond the
        model's positions.
      ValueError: a bad `dtype`, `template`, `mesh_shape`, prompt or model config.json.
      FileNotFoundError: no model folder, no config.json in it, or no tokenizer.
    """
    if dtype is not None:
        check_dtype(dtype)
    if template is not None:
        check_template(template)
    check_generate_kwargs(generate_kwargs)
    shape = parse_mesh_shape(mesh_shape)
    positions = read_model_config(model_path).max_position_embeddings
    tokenizer = Tokenizer.load(tokenizer_path or model_path)
    generate = config_for(tokenizer, **generate_kwargs)
    room = dict(buckets=buckets, template=template)
    check_room(tokenizer, prompts, generate.max_new_tokens, positions, **room)
    mesh = make_mesh(shape)
    model = load_on_mesh(model_path, mesh, dtype)
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, model.config, generate)
    return sample_text(
        sampler, state, tokenizer, prompts, seed, buckets=buckets, template=template, mesh=mesh
    )

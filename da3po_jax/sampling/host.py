"""Host side of sampling: text prompts -> a length bucket -> `Sampler` -> decoded text.

Everything variable-length lives here: prompts are rendered (chat template when the
tokenizer has one), tokenised, left-padded to the smallest bucket that fits the longest
and, when a fixed number of prompts per call is asked for, topped up with one-token filler
prompts whose outputs are dropped. The device only sees fixed shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.sampling.sampler import GenerateConfig, SampleOutput, Sampler

DEFAULT_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


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
) -> PromptBatch:
    """Renders, tokenises and left-pads `prompts` into one bucket.

    Args:
      tokenizer: the policy's tokenizer.
      prompts: user texts (rendered with the chat template when `render`).
      buckets: allowed prompt lengths; the smallest one that fits the longest prompt wins.
      num_prompts: pad the batch to this many rows (a fixed P per call), or None.
      render: apply `tokenizer.render_prompt`; False feeds the texts as they are.
    """
    if not prompts:
        raise ValueError("no prompts")
    texts = [tokenizer.render_prompt(p) if render else p for p in prompts]
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
      buckets, num_prompts, render: as `encode_prompts`.
    """
    batch = encode_prompts(
        tokenizer, prompts, buckets=buckets, num_prompts=num_prompts, render=render
    )
    out = sampler.generate(state, batch.tokens, batch.mask, seed, config)
    out = jax.tree.map(
        lambda x: np.asarray(x)[: batch.num_real] if x.ndim else np.asarray(x), jax.device_get(out)
    )
    texts = decode_responses(tokenizer, out.tokens, out.lengths)
    return TextSamples(texts=texts, output=out, prompts=batch)


def sample_from_folder(
    model_path: str,
    prompts: Sequence[str],
    *,
    tokenizer_path: str | None = None,
    seed: int = 0,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    **generate_kwargs,
) -> TextSamples:
    """Loads a HF model folder (and its tokenizer) and samples responses to `prompts`.

    Args:
      model_path: folder with config.json and safetensors weights.
      prompts: user texts (rendered with the chat template when there is one).
      tokenizer_path: tokenizer folder (default: `model_path`).
      seed: PRNG seed.
      buckets: allowed prompt lengths.
      **generate_kwargs: `GenerateConfig` fields (num_samples, max_new_tokens, ...).
    """
    from da3po_jax.models.hf_io import load_model

    tokenizer = Tokenizer.load(tokenizer_path or model_path)
    model = load_model(model_path)
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, model.cfg, config_for(tokenizer, **generate_kwargs))
    return sample_text(sampler, state, tokenizer, prompts, seed, buckets=buckets)

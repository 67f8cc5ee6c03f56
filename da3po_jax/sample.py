"""Quick sampling check: `python -m da3po_jax.sample --model=DIR --prompt="What is 2+3?"`.

Loads a Hugging Face model folder, renders each `--prompt` with the tokenizer's chat
template (when it has one) and prints `--num_samples` responses per prompt.
"""

from __future__ import annotations

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
flags.mark_flags_as_required(["model", "prompt"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from da3po_jax.sampling.host import sample_from_folder  # after flags: fast --help

    result = sample_from_folder(
        _MODEL.value,
        _PROMPT.value,
        tokenizer_path=_TOKENIZER.value,
        seed=_SEED.value,
        num_samples=_NUM_SAMPLES.value,
        max_new_tokens=_MAX_NEW_TOKENS.value,
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        top_p=_TOP_P.value,
    )
    for prompt, texts, lengths in zip(_PROMPT.value, result.texts, result.output.lengths):
        print(f"=== prompt: {prompt!r}")
        for g, (text, n) in enumerate(zip(texts, lengths)):
            print(f"--- sample {g} ({int(n)} tokens)\n{text}")


if __name__ == "__main__":
    app.run(main)

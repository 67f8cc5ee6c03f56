"""Host helper and CLI: text prompts -> buckets -> generate -> decoded text."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver
from sampling_helpers import tiny_model

from da3po_jax import sample as sample_cli
from da3po_jax.models import save_model
from da3po_jax.models.tokenizer import Tokenizer
from da3po_jax.sampling import Sampler, generate
from da3po_jax.sampling.host import (
    config_for,
    decode_responses,
    encode_prompts,
    pick_bucket,
    sample_text,
)

PROMPTS = ["What is 3 + 4?", "Hello world, this is a tiny tokenizer for tests.", "x"]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return Tokenizer.load(tokenizer_dir)


def test_pick_bucket_is_smallest_that_fits():
    assert pick_bucket(1, (8, 16, 32)) == 8
    assert pick_bucket(16, (32, 8, 16)) == 16
    assert pick_bucket(17, (8, 16, 32)) == 32
    with pytest.raises(ValueError, match="largest bucket 32"):
        pick_bucket(33, (8, 16, 32))


def test_encode_prompts_left_pads_into_a_bucket_and_round_trips(tok):
    batch = encode_prompts(tok, PROMPTS, buckets=(16, 32, 64, 128), num_prompts=5)
    ids = tok.encode([tok.render_prompt(p) for p in PROMPTS])
    assert batch.tokens.shape == (5, pick_bucket(max(map(len, ids)), (16, 32, 64, 128)))
    assert batch.num_real == 3
    np.testing.assert_array_equal(batch.mask.sum(-1), [len(i) for i in ids] + [1, 1])
    assert batch.mask[:, -1].all(), "left padding: the last column is real"
    for row, mask, text in zip(batch.tokens, batch.mask, PROMPTS):
        assert tok.hf.decode(row[mask].tolist()) == tok.render_prompt(text)
        assert np.all(row[~mask] == tok.pad_id)
    with pytest.raises(ValueError, match="do not fit"):
        encode_prompts(tok, PROMPTS, num_prompts=2)


def test_decode_responses_cut_at_lengths_and_eos(tok):
    text = "Hello world"
    ids = tok.encode([text])[0]
    eos = tok.eos_ids[0]
    row = ids + [eos] + ids + [tok.pad_id] * 3
    tokens = np.asarray([[row, row]], np.int32)
    lengths = np.asarray([[len(ids) + 1, len(ids) - 1]], np.int32)
    texts = decode_responses(tok, tokens, lengths)
    assert texts[0][0] == text
    assert texts[0][1] == tok.hf.decode(ids[:-1])


def test_sample_text_matches_direct_generate(tok):
    cfg, graphdef, state, _ = tiny_model()
    assert tok.vocab_size <= cfg.vocab_size
    config = config_for(tok, num_samples=2, max_new_tokens=12, temperature=0.0)
    assert config.stop_ids == tok.eos_ids and config.pad_id == tok.pad_id
    sampler = Sampler(graphdef, cfg, config)
    result = sample_text(sampler, state, tok, PROMPTS, seed=0, num_prompts=4, buckets=(64, 128))
    out = result.output
    assert out.tokens.shape == (3, 2, 12) and out.lengths.shape == (3, 2)
    batch = result.prompts
    direct = generate(graphdef, state, batch.tokens, batch.mask, jax.random.key(0), config)
    np.testing.assert_array_equal(out.tokens, np.asarray(direct.tokens)[:3])
    np.testing.assert_array_equal(out.lengths, np.asarray(direct.lengths)[:3])
    for p in range(3):
        assert result.texts[p][0] == result.texts[p][1], "greedy samples agree"
        n = out.lengths[p, 0]
        assert result.texts[p][0] == tok.decode(out.tokens[p, 0, :n].tolist())
        assert out.mask[p, 0].sum() == n


def test_cli_prints_the_host_helpers_samples(tmp_path, tokenizer_dir, tok, capsys):
    cfg, graphdef, state, model = tiny_model()
    folder = save_model(model, str(tmp_path / "model"), tokenizer_dir=tokenizer_dir)
    prompt = "What is 3 + 4?"
    # only these flags are set: a full parse would also require the flags of other
    # commands' modules imported by this test process (e.g. da3po_jax.export's --workdir)
    flags.FLAGS.mark_as_parsed()
    values = dict(model=folder, prompt=[prompt], num_samples=2, max_new_tokens=6)
    with flagsaver.flagsaver(temperature=0.0, seed=3, **values):
        sample_cli.main(["sample"])
    printed = capsys.readouterr().out
    config = config_for(tok, num_samples=2, max_new_tokens=6, temperature=0.0)
    want = sample_text(Sampler(graphdef, cfg, config), state, tok, [prompt], seed=3)
    assert f"=== prompt: {prompt!r}" in printed
    for g in range(2):
        n = int(want.output.lengths[0, g])
        assert f"--- sample {g} ({n} tokens)\n{want.texts[0][g]}\n" in printed + "\n"

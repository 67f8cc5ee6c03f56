"""Tokenizer: chat template, stop ids, left padding, deterministic tiny BPE."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import CORPUS

from da3po_jax.models.tokenizer import Tokenizer, build_bpe_tokenizer


def test_chat_template_and_special_ids(tokenizer_dir):
    tok = Tokenizer.load(tokenizer_dir)
    assert os.path.isfile(os.path.join(tokenizer_dir, "chat_template.jinja"))
    added = tok.hf.get_added_vocab()
    assert set(tok.eos_ids) == {added["<|im_end|>"], added["<|endoftext|>"]}
    assert tok.eos_ids[0] == added["<|im_end|>"]  # the tokenizer's own EOS comes first
    assert tok.pad_id == added["<|endoftext|>"]
    text = tok.render_prompt("what is 2 + 3?", system="Be brief.")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nwhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode([text])[0]
    assert ids[0] == added["<|im_start|>"] and ids.count(added["<|im_end|>"]) == 2


def test_left_padding_and_decode(tokenizer_dir):
    tok = Tokenizer.load(tokenizer_dir)
    seqs = tok.encode(["Answer: 12", "Hello world"])
    tokens, mask = tok.pad_left(seqs, 16)
    for row, seq, m in zip(tokens, seqs, mask):
        assert m.sum() == len(seq) and not m[: 16 - len(seq)].any()
        assert list(row[16 - len(seq) :]) == seq
        assert (row[: 16 - len(seq)] == tok.pad_id).all()
    assert tokens.dtype == np.int32 and mask.dtype == np.bool_
    with pytest.raises(ValueError, match="more than the length 2"):
        tok.pad_left(seqs, 2)
    eos = tok.eos_ids[0]
    assert tok.decode([*seqs[0], eos, *seqs[1]]) == "Answer: 12"


def test_generation_config_eos_ids_are_added(tmp_path, tokenizer_dir):
    import shutil

    folder = str(tmp_path / "tok")
    shutil.copytree(tokenizer_dir, folder)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [7, 9]}, f)
    tok = Tokenizer.load(folder)
    assert {7, 9} <= set(tok.eos_ids)


def test_plain_prompt_without_chat_template(tmp_path):
    folder = build_bpe_tokenizer(str(tmp_path / "plain"), CORPUS, 300, chat_template=None)
    tok = Tokenizer.load(folder)
    assert not tok.has_chat_template
    assert tok.render_prompt("2 + 2 =") == "2 + 2 ="
    added = tok.hf.get_added_vocab()
    # The base-model EOS first; the chat end-of-turn token still stops generation.
    assert tok.eos_ids == (added["<|endoftext|>"], added["<|im_end|>"])
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_prompt([{"role": "user", "content": "hi"}])


def test_build_is_deterministic(tmp_path):
    a = build_bpe_tokenizer(str(tmp_path / "a"), CORPUS, 300)
    b = build_bpe_tokenizer(str(tmp_path / "b"), CORPUS, 300)
    with (
        open(os.path.join(a, "tokenizer.json")) as fa,
        open(os.path.join(b, "tokenizer.json")) as fb,
    ):
        assert fa.read() == fb.read()
    tok = Tokenizer.load(a)
    assert 250 <= tok.vocab_size <= 300

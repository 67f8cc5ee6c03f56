"""Tokenizer: a thin wrapper over `transformers.AutoTokenizer` from a local folder.

It resolves the ids that generation needs (every stop/EOS id and a pad id) robustly across
families: Qwen instruct models end turns with `<|im_end|>` while their base models emit
`<|endoftext|>`, Llama-3 uses `<|eot_id|>` / `<|end_of_text|>`, and `generation_config.json`
may list several. Prompts are rendered with the chat template when the folder has one and
left-padded for generation.

`build_bpe_tokenizer` makes a small byte-level BPE tokenizer with a Qwen-style chat
template from a text corpus, deterministically and without downloads (tests, tiny demo).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np


def _drop_no_torch_notice(record: logging.LogRecord) -> bool:
    """`transformers` logs "PyTorch was not found. Models won't be available..." when it is
    imported without torch; this package uses it only for tokenizers, so that one message
    is dropped (installed before any `transformers` import, which happens lazily below)."""
    return not str(record.msg).startswith("PyTorch was not found")


if _drop_no_torch_notice not in logging.getLogger("transformers").filters:
    logging.getLogger("transformers").addFilter(_drop_no_torch_notice)

_TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# JSON files a tokenizer folder may hold; checked to name the culprit when loading fails.
_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "generation_config.json",
)
_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>")
_PAD_CANDIDATES = ("<|endoftext|>", "<|finetune_right_pad_id|>", "<|end_of_text|>")

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class TokenizerLoadError(ValueError):
    """A tokenizer folder whose files cannot be loaded (truncated / corrupt / invalid); the
    message names the folder and, when one is at fault, the file."""


def _read_json(path: str, what: str):
    """`path` parsed as JSON, or `TokenizerLoadError` naming it and where it breaks."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerLoadError(
            f"{what} {path} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}); "
            "the file looks truncated or corrupt"
        ) from e
    except UnicodeDecodeError as e:
        raise TokenizerLoadError(f"{what} {path} is not UTF-8 text ({e})") from e


def _check_json_files(path: str) -> None:
    """Raises `TokenizerLoadError` for the first unparsable JSON file of folder `path`."""
    for name in _JSON_FILES:
        file = os.path.join(path, name)
        if os.path.isfile(file):
            _read_json(file, "tokenizer file")


class Tokenizer:
    """Text <-> ids for prompts and responses.

    Attributes:
      hf: the underlying `transformers` tokenizer (left padding).
      eos_ids: every id that ends a response.
      pad_id: the id used for padding (never sampled as content).
      has_chat_template: whether prompts are rendered as chat messages.
    """

    def __init__(self, hf_tokenizer, eos_ids: Sequence[int], pad_id: int):
        self.hf = hf_tokenizer
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.pad_id = int(pad_id)

    @classmethod
    def load(cls, path: str) -> Tokenizer:
        """Loads the tokenizer saved in folder `path` (no network)."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer folder {path!r} does not exist")
        if not any(os.path.isfile(os.path.join(path, m)) for m in _TOKENIZER_MARKERS):
            raise FileNotFoundError(
                f"no tokenizer in {path!r}: expected one of {list(_TOKENIZER_MARKERS)}"
            )
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:  # tokenizers / transformers raise many types (even Exception)
            _check_json_files(path)  # names the broken file when there is one
            raise TokenizerLoadError(
                f"cannot load the tokenizer in folder {path!r}: {type(e).__name__}: {e}"
            ) from e
        hf.padding_side = "left"
        eos_ids = _resolve_eos_ids(hf, path)
        if not eos_ids:
            raise ValueError(f"tokenizer in {path!r} defines no EOS token")
        pad_id = _resolve_pad_id(hf, eos_ids)
        return cls(hf, eos_ids, pad_id)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def render_prompt(self, prompt: str | list[dict[str, str]], system: str | None = None) -> str:
        """The text fed to the model: the chat template applied when present, else the
        plain prompt (a message list is then an error)."""
        if not self.has_chat_template:
            if not isinstance(prompt, str):
                raise ValueError("tokenizer has no chat template; pass the prompt as a string")
            return prompt
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids of each text, with no special tokens added (templates carry them)."""
        return [self.hf.encode(t, add_special_tokens=False) for t in texts]

    def pad_left(self, seqs: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
        """Left-pads `seqs` to `length`: (tokens int32 [B, length], mask bool [B, length])."""
        tokens = np.full((len(seqs), length), self.pad_id, np.int32)
        mask = np.zeros((len(seqs), length), np.bool_)
        for i, s in enumerate(seqs):
            if len(s) > length:
                raise ValueError(f"sequence {i} has {len(s)} tokens, more than the length {length}")
            if len(s):
                tokens[i, length - len(s) :] = s
                mask[i, length - len(s) :] = True
        return tokens, mask

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, cut at the first EOS id."""
        ids = [int(i) for i in ids]
        for j, i in enumerate(ids):
            if i in self.eos_ids:
                ids = ids[:j]
                break
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)


def _special_id(hf, token: str) -> int | None:
    """The id of `token` if the tokenizer has it as a single added/special token."""
    added = hf.get_added_vocab()
    return added.get(token)


def _resolve_eos_ids(hf, path: str) -> list[int]:
    ids: list[int] = []

    def add(x):
        for i in x if isinstance(x, (list, tuple)) else [x]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))

    add(hf.eos_token_id)
    gen_cfg = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_cfg):
        doc = _read_json(gen_cfg, "generation config")
        if not isinstance(doc, dict):
            raise TokenizerLoadError(
                f"generation config {gen_cfg} holds a JSON {type(doc).__name__}, expected an object"
            )
        value = doc.get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        if not all(i is None or (isinstance(i, int) and not isinstance(i, bool)) for i in values):
            raise TokenizerLoadError(
                f"generation config {gen_cfg}: eos_token_id must be a token id or a list of "
                f"them, got {value!r}"
            )
        add(value)
    for token in _STOP_TOKENS:
        add(_special_id(hf, token))
    return ids


def _resolve_pad_id(hf, eos_ids: Sequence[int]) -> int:
    if hf.pad_token_id is not None:
        return int(hf.pad_token_id)
    for token in _PAD_CANDIDATES:
        i = _special_id(hf, token)
        if i is not None:
            return i
    return int(eos_ids[0])


def build_bpe_tokenizer(
    out_dir: str,
    corpus: Iterable[str],
    vocab_size: int = 512,
    chat_template: str | None = QWEN_CHAT_TEMPLATE,
) -> str:
    """Trains a byte-level BPE tokenizer on `corpus` and saves it as a HF tokenizer folder.

    Digits are always single tokens, as in Qwen's tokenizers.
    Deterministic for the same corpus and vocab size. Special tokens follow Qwen:
    `<|endoftext|>` (pad, base EOS), `<|im_start|>`, `<|im_end|>` (chat EOS).
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    raw = RawTokenizer(models.BPE())
    # Digits are split one by one (as Qwen's tokenizers do): arithmetic stays learnable.
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(list(corpus), trainer=trainer)
    eos = "<|im_end|>" if chat_template else "<|endoftext|>"
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=eos, pad_token="<|endoftext|>", padding_side="left"
    )
    if chat_template:
        hf.chat_template = chat_template
    os.makedirs(out_dir, exist_ok=True)
    hf.save_pretrained(out_dir)
    return out_dir

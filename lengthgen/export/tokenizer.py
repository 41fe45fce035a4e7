"""The tokenizer an export carries, as `tokenizers` files that `AutoTokenizer` loads: a task's own
small vocabulary (Task.vocab: the three specials, then the task's tokens, each id its index), a
text run's byte tokenizer (id = byte + 3), or its BPE tokenizer.json as trained."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.tasks.base import SPECIALS


def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable character standing for each byte 0..255, as the
    ByteLevel pre-tokenizer writes them."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


# The unknown-token name a task tokenizer gives WordLevel, which no vocabulary holds: text with a
# character outside the task's vocabulary then raises ("WordLevel error: Missing [UNK] token from the
# vocabulary") instead of reading as <pad>, a token the model never saw in a question.
NO_UNKNOWN = "[not in the vocabulary]"


def task_tokenizer(task):
    """A word-level tokenizer over the task's vocabulary: text is split into the task's tokens
    (longest first, or at its separator), the specials matched whole; anything else raises."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(task.vocab)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=NO_UNKNOWN))
    if task.sep:
        tok.pre_tokenizer = pre_tokenizers.Split(task.sep, behavior="removed")
    else:
        pieces = sorted(task.vocab, key=len, reverse=True)
        tok.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(map(re.escape, pieces))), behavior="isolated")
        tok.decoder = decoders.Fuse()  # the tokens side by side, as Task.decode writes them
    tok.add_special_tokens(list(SPECIALS[:2]))
    return tok


def bytes_tokenizer():
    """lengthgen's byte tokenizer (tasks/corpus.py): each UTF-8 byte one token, id = byte + 3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({char: len(SPECIALS) + b for b, char in enumerate(byte_chars())})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS[:2]))
    return tok


def write_tokenizer(folder: Path, task, run: Path) -> None:
    """tokenizer.json and tokenizer_config.json in `folder`."""
    try:
        corpus = getattr(task, "corpus", None)
        if corpus is not None and corpus.tokenizer != "bytes":  # the BPE the run trained on
            source = run / "tokenizer.json"
            shutil.copyfile(source if source.is_file() else corpus.ensure() / "tokenizer.json", folder / "tokenizer.json")
        else:
            (bytes_tokenizer() if corpus is not None else task_tokenizer(task)).save(str(folder / "tokenizer.json"))
    except ImportError:
        raise UserError("lengthgen export writes a tokenizer with the tokenizers library, part of the hf extra: "
                        "pip install 'lengthgen[hf]'") from None
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": SPECIALS[0], "eos_token": SPECIALS[1],
              "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")

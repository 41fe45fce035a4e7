"""Greedy decoding: the KV cache gives what full recomputation gives, generated IDs feed
back, and answers line up with the targets."""
from __future__ import annotations

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.generate import generate_answers, greedy
from lengthgen.model.position_transforms import base_ids
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import get_task


def model_for(position: str, vocab: int, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layer=2, n_head=4, position=position, max_positions=64, init="torch")
    return Transformer(cfg, vocab).eval()


def content_id(model, hidden, last_id):
    """An ID that depends on the hidden state, as a predicted one does: 1..8 past the last."""
    return last_id + 1 + (hidden.sum(-1) * 1000).long() % 8


@pytest.mark.parametrize("position", ["nope", "rope", "learned", "sinusoidal", "xpos", "fope", "path", "path-fox"])
def test_the_cache_decodes_what_recomputation_decodes(position):
    task = get_task("decimal_addition", coupled=True)
    batch = task.sample(24, torch.tensor([2, 5, 7] * 8), torch.Generator().manual_seed(1))
    model = model_for(position, task.vocab_size)
    q = int(batch.question_len[0])
    rows = batch.question_len == q
    prompt, ids = batch.inputs[rows, :q], base_ids(batch)[rows, :q]
    cached = greedy(model, prompt, ids, 6, content_id)
    full = greedy(model, prompt, ids, 6, content_id, use_cache=False)
    assert torch.equal(cached[0], full[0]) and torch.equal(cached[1], full[1])
    assert (cached[1][:, 1:] > cached[1][:, :-1]).all()  # the IDs fed back are the ones next_id gave
    assert torch.equal(generate_answers(model, batch), generate_answers(model, batch, use_cache=False))


def test_a_generated_token_is_the_argmax_after_the_tokens_before_it():
    """Decoding appends the argmax: rerunning prompt + generated tokens in one pass gives
    the same argmax at every position from the question's last token on."""
    task = get_task("multiplication")  # question lengths differ within a length: decoded in groups
    batch = task.sample(16, 6, torch.Generator().manual_seed(2))
    assert batch.question_len.unique().numel() > 1
    model = model_for("rope", task.vocab_size)
    pred = generate_answers(model, batch)
    for i in range(len(batch)):
        q, a = int(batch.question_len[i]), int(batch.scored[i].sum())
        sequence = torch.cat([batch.inputs[i, :q], pred[i, q - 1:q - 1 + a]])[None]
        assert torch.equal(model(sequence)[0, q - 1:q - 1 + a].argmax(-1), pred[i, q - 1:q - 1 + a])
        assert (pred[i, :q - 1] == -1).all()


@pytest.mark.parametrize("position", ["alibi", "tra", "cope"])
def test_schemes_over_whole_windows_refuse_the_cache(position):
    task = get_task("copy")
    batch = task.sample(2, 4, torch.Generator().manual_seed(0))
    model = model_for(position, task.vocab_size)
    with pytest.raises(ValueError, match=f"KV cache needs a scheme without a bias or content hook.*not {position}"):
        generate_answers(model, batch)
    generate_answers(model, batch, use_cache=False)  # recomputation works for every scheme

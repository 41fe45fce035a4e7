"""An exported run, loaded with the real `transformers` on the CPU, gives lengthgen's own logits
(float tolerance) for every positional scheme and every method family, with explicit position IDs
where the scheme reads them; `generate` gives lengthgen's KV-cache decoding; a looped model's
`num_steps` and stop rules read out where lengthgen's stop passes do."""
from __future__ import annotations

import pytest
import torch

from exports import LOOPED, PPC, pair, sample_batch
from lengthgen.methods.looped.stop_passes import confidence, confidence_per_sample, first_confident, fixed
from lengthgen.methods.ppc import predicted_id
from lengthgen.model.generate import greedy
from lengthgen.model.positions import SCHEMES

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def root(tmp_path_factory, one_thread):
    return tmp_path_factory.mktemp("exports")


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_scheme_gives_lengthgens_logits(root, scheme):
    run, model, hf = pair(root, scheme, f"model.position={scheme}")
    batch = sample_batch(run)
    ids = torch.randint(0, 30, batch.inputs.shape, generator=torch.Generator().manual_seed(1)).sort(1).values
    with torch.no_grad():
        for position_ids in (None, ids):  # 0..T-1, and explicit (shifted, skipping) IDs
            torch.testing.assert_close(hf(batch.inputs, position_ids=position_ids).logits,
                                       model(batch.inputs, position_ids), **TOL)


@pytest.mark.parametrize("scheme", ["rope", "alibi", "path"])  # with a KV cache (path: its recurrence), and by recomputation
def test_generate_gives_lengthgens_greedy_tokens(root, scheme):
    run, model, hf = pair(root, f"gen-{scheme}", f"model.position={scheme}")
    prompt = sample_batch(run, 3).inputs[:, :4]
    ids = torch.arange(4)[None].expand(len(prompt), -1)
    want, _ = greedy(model, prompt, ids, 6, use_cache=scheme != "alibi")
    got = hf.generate(prompt, max_new_tokens=6)
    assert torch.equal(got[:, 4:], want) and torch.equal(got[:, :4], prompt)


def test_ppc_logits_and_generation_read_the_coupled_ids(root):
    run, model, hf = pair(root, "ppc", *PPC)
    batch = sample_batch(run, 3)
    with torch.no_grad():
        torch.testing.assert_close(hf(batch.inputs, position_ids=batch.position_ids).logits,
                                   model(batch.inputs, batch.position_ids), **TOL)
        torch.testing.assert_close(hf.model.id_head.weight, model.id_head.weight)
    q = int(batch.question_len[0])
    rows = batch.question_len == q
    prompt, prompt_ids = batch.inputs[rows, :q], batch.position_ids[rows, :q]
    want, _ = greedy(model, prompt, prompt_ids, 4, next_id=predicted_id)
    assert torch.equal(hf.generate(prompt, max_new_tokens=4, position_ids=prompt_ids)[:, q:], want)


def test_multi_level_coupled_ids_give_lengthgens_logits(root):
    """A learned table per level (packed IDs, lengthgen.tasks.coupled_levels) reads the same in transformers."""
    run, model, hf = pair(root, "levels", "task.name=multi_operand_addition", "task.train_min=1", "task.train_max=2",
                          "task.options={operands=[2, 3], coupled=2}", "model.position=learned",
                          "model.position_options={levels=2}", "model.max_positions=12",
                          "data.position_transform=random_offset",
                          "data.position_transform_options={levels=2, max_position=11, keep_zero=true}")
    batch = sample_batch(run, 2)
    with torch.no_grad():
        torch.testing.assert_close(hf(batch.inputs, position_ids=batch.position_ids).logits,
                                   model(batch.inputs, batch.position_ids), **TOL)


@pytest.fixture(scope="module")
def looped(root):
    return pair(root, "looped", *LOOPED)


def blanked(batch):
    """The blanked inputs lengthgen's stop passes read: trimmed to the widest answer, and its mask."""
    w = int(batch.widths.max())
    return batch.blank_answers().inputs[:, :w], batch.scored[:, :w]


def test_looped_num_steps_is_lengthgens_fixed_read_out(looped):
    run, model, hf = looped
    batch = sample_batch(run)
    inputs, _ = blanked(batch)
    for n in (1, 3):
        with torch.no_grad():
            torch.testing.assert_close(hf(inputs, num_steps=n).logits, model(inputs, n_steps=n), **TOL)
        pred, _ = fixed(model, batch, n)
        assert torch.equal(hf(inputs, stop=f"fixed:{n}").logits.argmax(-1), pred[:, :inputs.shape[1]])


@pytest.mark.parametrize("rule, lengthgen_pass", [("confidence", confidence), ("confidence-per-sample", confidence_per_sample),
                                                  ("first-confident", first_confident)])
def test_looped_stop_rules_pick_lengthgens_steps(looped, rule, lengthgen_pass):
    run, model, hf = looped
    batch = sample_batch(run, rows=8)
    inputs, scored = blanked(batch)
    want_pred, want_steps = lengthgen_pass(model, batch, 6)
    for mask in (scored, None):  # given, and found from the BLANK slots (one length per batch)
        out = hf(inputs, stop=f"{rule}:6", answer_mask=mask)
        assert torch.equal(out.steps, want_steps)
        assert torch.equal(out.logits.argmax(-1)[scored], want_pred[:, :inputs.shape[1]][scored])


def test_looped_generate_reads_the_whole_answer(looped):
    run, model, hf = looped
    batch = sample_batch(run)
    q, answer = int(batch.question_len[0]), int(batch.scored[0].sum())
    got = hf.generate(batch.inputs[:, :q], max_new_tokens=answer, num_steps=4)
    pred, _ = fixed(model, batch, 4)
    assert torch.equal(got[:, q:], pred[:, q - 1:q - 1 + answer])
    with pytest.raises(ValueError, match="T\\(n\\)"):
        hf(batch.inputs, stop="oracle")


@pytest.mark.parametrize("method", ["ntp-loop", "looped-halt"])
def test_other_looped_families(root, method, capsys):
    run, model, hf = pair(root, method, *LOOPED, f"method={method}")
    batch = sample_batch(run)
    with torch.no_grad():
        if method == "ntp-loop":  # a fixed loop read token by token
            torch.testing.assert_close(hf(batch.inputs).logits, model(batch.inputs, n_steps=run.method.n_loops), **TOL)
            prompt = batch.inputs[:, :3]
            ids = torch.arange(3)[None].expand(len(prompt), -1)
            assert torch.equal(hf.generate(prompt, max_new_tokens=2)[:, 3:], greedy(model, prompt, ids, 2, use_cache=False)[0])
        else:  # the halting head stays behind; the looped block is exported
            inputs, _ = blanked(batch)
            torch.testing.assert_close(hf(inputs, num_steps=2).logits, model(inputs, n_steps=2), **TOL)
            assert not hasattr(hf.model, "halt_head")

"""Bounds on every count (issue 7): an exported looped model's `num_steps`, its stop rules' windows
and `generate`'s `max_new_tokens` are positive integers up to caps derived from the run (4 T(n) + 64
and 4 answers at the longest length it was trained or evaluated at), negative, zero and fractional
values refused; its tokenizer raises on a character outside the vocabulary; and `lengthgen eval`
refuses a stop rule's count past what the run could need, at once."""
from __future__ import annotations

import json

import pytest
import torch

from exports import LOOPED, hf_model, trained
from lengthgen.cli import main
from lengthgen.evaluation.bounds import LOOP_FACTOR, LOOP_SLACK, check_count, loop_cap, rule_counts
from lengthgen.errors import UserError
from lengthgen.evaluation.evaluate import load_assembled
from lengthgen.methods.base import steps_at
from tests.helpers.tiny_runs import one_line_error


@pytest.fixture(scope="module")
def looped(tmp_path_factory, one_thread):
    """A tiny looped copy run evaluated up to length 6, exported, and loaded with transformers."""
    root = tmp_path_factory.mktemp("export-bounds")
    run = trained(root, "run", *LOOPED)
    assert main(["eval", str(run), "--lengths", "2:6", "--no-progress"]) == 0
    assert main(["export", str(run), "--out", str(root / "hf")]) == 0
    return run, root / "hf", hf_model(root / "hf")


def test_the_caps_are_derived_from_the_longest_length_evaluated(looped):
    run, out, _ = looped
    config = json.loads((out / "config.json").read_text())
    task = load_assembled(run, torch.device("cpu"))[0].task
    assert config["bounds_from_length"] == 6  # eval.csv's longest, past train_max = 4
    assert config["max_num_steps"] == LOOP_FACTOR * steps_at(task, 6) + LOOP_SLACK
    answer = int(task.sample(64, 6, torch.Generator().manual_seed(0)).scored.sum(1).max())
    assert config["max_new_tokens_cap"] == 4 * answer


@pytest.mark.parametrize("kwargs,says", [
    ({"num_steps": 1_000_000}, "num_steps = 1,000,000 is past this model's bound"),
    ({"num_steps": -1}, "num_steps must be a positive integer, got -1"),
    ({"num_steps": 0}, "must be a positive integer, got 0"),
    ({"num_steps": 2.5}, "must be a positive integer, got 2.5"),
    ({"num_steps": True}, "must be a positive integer, got True"),
    ({"stop": "confidence:100000000"}, "past this model's bound"),
    ({"stop": "first-confident:0"}, "must be a positive integer, got 0"),
    ({"stop": "fixed:-3"}, "is not one of"),
])
def test_a_looped_models_counts_are_checked(looped, kwargs, says):
    *_, model = looped
    ids = torch.tensor([[3, 4, 4, 3, 5, 2, 2, 2]])
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        model(ids, **kwargs)


def test_counts_within_the_bounds_run(looped):
    *_, model = looped
    ids = torch.tensor([[3, 4, 4, 3, 5, 2, 2, 2]])
    bound = model.config.max_num_steps
    assert model(ids, num_steps=torch.tensor(3)).steps.tolist() == [3]  # an integer tensor is a count
    assert int(model(ids, stop=f"confidence:{bound}").steps[0]) <= bound
    model.config.max_num_steps = bound + 1  # raised on purpose: the bound is the config's
    assert model(ids, num_steps=bound + 1).steps.tolist() == [bound + 1]
    model.config.max_num_steps = bound


@pytest.mark.parametrize("tokens,says", [(0, "got 0"), (-2, "got -2"), (100_000, "past this model's bound")])
def test_generate_checks_max_new_tokens(looped, tokens, says):
    *_, model = looped
    question = torch.tensor([[3, 4, 4, 3, 5]])
    with pytest.raises(ValueError, match=says):
        model.generate(question, max_new_tokens=tokens, num_steps=4)
    assert model.generate(question, max_new_tokens=1, num_steps=4).shape == (1, 6)  # issue 7: 0 gave 1 token
    if getattr(model, "generation_config", None) is not None:  # generation_config.json's answer length
        assert model.generate(question, num_steps=4).shape[1] == 5 + model.generation_config.max_new_tokens


def test_the_tokenizer_raises_on_characters_outside_the_vocabulary(looped):
    from transformers import AutoTokenizer

    _, out, _ = looped
    tok = AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    assert tok("0110=").input_ids == [3, 4, 4, 3, 5]
    for text in ("01x1=", "0 1=", "01=?"):
        with pytest.raises(Exception, match="Missing \\[UNK\\] token"):
            tok(text)


def test_eval_refuses_a_stop_count_past_what_the_run_could_need(looped, capsys):
    """`--stop fixed:12000000 --lengths 1:2` sat under the 12.8M cap and ran for minutes."""
    run, _, _ = looped
    task = load_assembled(run, torch.device("cpu"))[0].task
    cap = loop_cap(task, [4])  # train_max 4 is longer than the lengths asked
    for stop in ("fixed:12000000", f"fixed:{cap + 1}", f"confidence:+{cap + 1}", f"confidence-per-sample:8:{cap + 1}"):
        capsys.readouterr()
        assert main(["eval", str(run), "--stop", stop, "--lengths", "1:2", "--samples", "4", "--no-progress"]) == 2
        assert f"this run needs at most {cap}" in one_line_error(capsys)
    assert main(["eval", str(run), "--stop", f"fixed:{cap}", "--lengths", "1:2", "--samples", "4", "--no-progress",
                 "--out", str(run.parent / "elsewhere")]) == 0


def test_counts_are_read_as_positive_integers():
    assert rule_counts("confidence-per-sample:+20:3") == [20, 3] and rule_counts("oracle") == []
    assert check_count("n", "12") == 12
    for bad in (0, -1, 2.0, "abc", "nan", True, None, "1e3"):
        with pytest.raises(UserError, match="n must be a positive integer"):
            check_count("n", bad)
    with pytest.raises(UserError, match="n = 9 is past"):
        check_count("n", 9, cap=8)

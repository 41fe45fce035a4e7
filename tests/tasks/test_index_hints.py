"""Index hints (`index_hints = true`) on decimal_addition and addition: every answer against a
brute-force solver that checks the hints name the significances of the digits combined and adds
the digits alone; the digits are the plain task's draws; the offsets, the limits and the refusals."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from tests.helpers.task_checks import check_answers, check_layout, solve_hinted_addition

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.tasks import get_task
from lengthgen.tasks.hints import HINTS, MAX_HINTED

VARIANTS = [("decimal_addition", {}), ("decimal_addition", {"operands": "different"}),
            ("decimal_addition", {"operands": "independent"}), ("decimal_addition", {"eos": True}),
            ("decimal_addition", {"bos": True}),
            ("addition", {})]
IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options in VARIANTS]


def solver(name: str, options: dict):
    base, units_first = (10, True) if name == "decimal_addition" else (2, False)
    law = options.get("operands", "equal")
    return lambda q, n: solve_hinted_addition(q, n, base, units_first, "different" if law == "different" else "equal")


def layout(task, batch, n) -> None:
    if not getattr(task, "bos", False):  # check_layout knows no BOS; tests/tasks/test_cho_data.py checks it
        check_layout(task, batch, n)


def strip(text: str) -> str:
    return "".join(c for c in text if c not in HINTS)


@pytest.mark.parametrize("name, options", VARIANTS, ids=IDS)
def test_answers_and_hints_against_brute_force(name, options):
    task = get_task(name, index_hints=True, **options)
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 9, 30, MAX_HINTED):
        batch = task.sample(300, n, g)
        layout(task, batch, n)
        check_answers(task, batch, n, solver(name, options))
    mixed = torch.randint(1, MAX_HINTED + 1, (500,), generator=g)
    batch = task.sample(500, mixed, g)
    layout(task, batch, mixed)
    check_answers(task, batch, mixed, solver(name, options))


@pytest.mark.parametrize("name, options", VARIANTS, ids=IDS)
def test_the_digits_are_the_plain_tasks_draws(name, options):
    """The hints are drawn after everything else: without them the text is the plain task's."""
    hinted, plain = get_task(name, index_hints=True, **options), get_task(name, **options)
    lengths = torch.tensor([1, 7, 3, 20, 2, 51])
    one = hinted.sample(len(lengths), lengths, torch.Generator().manual_seed(4))
    two = plain.sample(len(lengths), lengths, torch.Generator().manual_seed(4))
    for i in range(len(lengths)):
        question, answer = hinted.to_text(one, i)
        assert (strip(question), strip(answer)) == plain.to_text(two, i)
        assert len(question) == 2 * len(strip(question)) - 2  # every digit hinted, + and = not


def test_training_ranges_are_hinted_too():
    task = get_task("decimal_addition", index_hints=True, operands="independent")
    batch = task.sample_range(400, 1, 12, torch.Generator().manual_seed(5))
    check_layout(task, batch, batch.lengths)
    check_answers(task, batch, batch.lengths, solver("decimal_addition", {}))


def offsets(task, n: int, samples: int = 4000) -> Counter:
    batch = task.sample(samples, n, torch.Generator().manual_seed(n))
    return Counter(HINTS.index(task.to_text(batch, i)[1][0]) for i in range(samples))  # the units digit's hint


def test_offsets_are_uniform_over_those_that_fit():
    task = get_task("decimal_addition", index_hints=True)
    seen = offsets(task, 40)  # 12 offsets, 0..11: the last digit takes hint 51 at most
    assert sorted(seen) == list(range(12))
    assert all(abs(count / 4000 - 1 / 12) < 0.02 for count in seen.values())
    assert offsets(task, MAX_HINTED, 200) == Counter({0: 200})
    assert len(offsets(task, 1)) == len(HINTS) - 1  # 0..50


@pytest.mark.parametrize("name", ["decimal_addition", "addition"])
def test_longer_problems_are_refused(name):
    task = get_task(name, index_hints=True)
    for length in (MAX_HINTED + 1, torch.tensor([3, MAX_HINTED + 1])):
        with pytest.raises(ValueError, match="index_hints has 52 hint tokens") as err:
            task.sample(2, length, torch.Generator())
        assert "\n" not in str(err.value)
    sets = [f"task.name={name}", "task.options={index_hints=true}", "task.train_max=20", "eval.lengths=1:51"]
    assert new_run_config(None, sets).task.options == {"index_hints": True}
    for extra, key in ((["task.train_max=52"], "task.train_max includes 52"),
                       (["eval.lengths=1:60"], "eval.lengths includes 60"),
                       (["tests.interval=10", "tests.lengths=30,52"], "tests.lengths includes 52")):
        with pytest.raises(ConfigError, match=key) as err:
            new_run_config(None, sets + extra)
        assert "\n" not in str(err.value) and "index_hints" in str(err.value)


@pytest.mark.parametrize("options, word", [({"index_hints": 1}, "index_hints must be true or false"),
                                           ({"index_hints": True, "coupled": True}, "choose one"),
                                           ({"index_hints": True, "abacus": True}, "choose one")])
def test_bad_options_are_one_line_config_errors(options, word):
    with pytest.raises(ValueError, match=word):
        get_task("decimal_addition", **options)
    table = "{" + ", ".join(f"{k}={str(v).lower()}" for k, v in options.items()) + "}"
    with pytest.raises(ConfigError, match=word) as err:
        new_run_config(None, ["task.name=decimal_addition", f"task.options={table}"])
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="index_hints must be true or false"):
        new_run_config(None, ["task.name=addition", "task.options={index_hints=\"yes\"}"])


def test_the_documented_examples():
    """docs/tasks.md and the modules' docstrings, offset 0."""
    assert solve_hinted_addition("c6b5a3+c0b4a9=", 3) == ("a2b0c7d0", 3)
    assert solve_hinted_addition("c1b0a1+c0b1a1=", 3, base=2, units_first=False) == ("d1c0b0a0", 3)


def test_vocabulary_and_random_baseline():
    for name, symbols in (("decimal_addition", 10), ("addition", 2)):
        plain, hinted = get_task(name), get_task(name, index_hints=True)
        assert hinted.tokens == plain.tokens + HINTS and len(set(hinted.tokens)) == len(hinted.tokens)
        # the hints follow from the question: chance guesses the n + 1 digits only
        assert hinted.random_baseline(4) == pytest.approx(symbols ** -5) == plain.random_baseline(4)

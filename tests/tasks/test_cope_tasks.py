"""The CoPE paper's selective copy and counting tasks: answers against brute-force solvers at every
option's edge, their laws (the blank places; the released counting generator, rewritten here in plain
Python with its redraws), the answer sources, and bad options as one-line config errors."""
from __future__ import annotations

import math
import random
from collections import Counter
from itertools import combinations

import pytest
import torch
from tests.helpers.task_checks import (
    LETTERS,
    check_answers,
    check_layout,
    solve_counting,
    solve_selective_copy,
)

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.tasks import get_task

# ---------------------------------------------------------------- selective copy

@pytest.mark.parametrize("options", [{}, {"blank_ratio": 0}, {"blank_ratio": 0.5}, {"blank_ratio": 2},
                                     {"blank_ratio": 3.7}, {"symbols": 1}, {"symbols": 26, "blank_ratio": 0.25}])
def test_selective_copy_against_brute_force(options):
    task = get_task("selective_copy", **options)
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 5, 64, 128):
        batch = task.sample(200, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n, lambda q, n: solve_selective_copy(q, n, **options))
    mixed = torch.randint(1, 40, (300,), generator=g)
    check_answers(task, task.sample(300, mixed, g), mixed, lambda q, n: solve_selective_copy(q, n, **options))


def test_blanks_round_half_up():
    """3 symbols at blank_ratio 0.5: 1.5 blanks, so 2; 5 at 0.1: 0.5, so 1; 4 at 0.1: 0.4, so 0."""
    for ratio, n, blanks in ((0.5, 3, 2), (0.1, 5, 1), (0.1, 4, 0), (1.0, 7, 7), (2.0, 128, 256)):
        batch = get_task("selective_copy", blank_ratio=ratio).sample(3, n, torch.Generator().manual_seed(1))
        assert (batch.question_len == n + blanks + 1).all(), (ratio, n)


def test_blank_places_are_a_uniform_subset_and_symbols_uniform():
    task = get_task("selective_copy")  # 2 symbols, 2 blanks: the 6 ways to place them, each 1/6
    batch = task.sample(6000, 2, torch.Generator().manual_seed(2))
    patterns = Counter("".join("." if c == "." else "x" for c in task.to_text(batch, i)[0][:-1]) for i in range(6000))
    assert set(patterns) == {"".join("." if k in c else "x" for k in range(4)) for c in combinations(range(4), 2)}
    assert all(abs(count / 6000 - 1 / 6) < 0.02 for count in patterns.values())
    batch = task.sample(4000, 32, torch.Generator().manual_seed(3))  # every place blank half the time
    blank = (batch.inputs[:, :64] == task.token_id(".")).double().mean(0)
    assert ((blank - 0.5).abs() < 0.04).all()
    symbols = Counter(batch.targets[batch.scored].tolist())
    assert len(symbols) == 16 and all(abs(c / sum(symbols.values()) - 1 / 16) < 0.005 for c in symbols.values())


def test_selective_copy_sources_hold_the_answers():
    task = get_task("selective_copy", blank_ratio=1.5)
    batch = task.sample(64, torch.randint(1, 30, (64,), generator=torch.Generator().manual_seed(4)),
                        torch.Generator().manual_seed(5))
    source = task.source_positions(batch)
    assert torch.equal(source >= 0, batch.scored)
    rows, cols = batch.scored.nonzero(as_tuple=True)
    assert torch.equal(batch.inputs[rows, source[rows, cols]], batch.targets[rows, cols])
    assert (source[rows, cols] < batch.question_len[rows] - 1).all()
    assert (batch.inputs[rows, source[rows, cols]] != task.token_id(".")).all()


@pytest.mark.parametrize("options, word", [({"blank_ratio": -0.5}, "blank_ratio"), ({"blank_ratio": float("nan")}, "blank_ratio"),
                                           ({"blank_ratio": float("inf")}, "blank_ratio"), ({"blank_ratio": True}, "blank_ratio"),
                                           ({"blank_ratio": "1"}, "blank_ratio"), ({"symbols": 0}, "symbols"),
                                           ({"symbols": 27}, "symbols"), ({"symbols": 2.0}, "symbols")])
def test_selective_copy_bad_options(options, word):
    with pytest.raises(ValueError, match=word):
        get_task("selective_copy", **options)


# ---------------------------------------------------------------- counting

@pytest.mark.parametrize("variables", [1, 3, 5, 26])
def test_counting_against_brute_force(variables):
    task = get_task("counting", variables=variables)
    g = torch.Generator().manual_seed(variables)
    for n in (1, 2, 3, 10, 100, 512):
        batch = task.sample(100, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n, lambda q, n: solve_counting(q, n, variables))
    mixed = torch.randint(1, 80, (300,), generator=g)
    check_answers(task, task.sample(300, mixed, g), mixed, lambda q, n: solve_counting(q, n, variables))


def released_program(n: int, variables: int, rng: random.Random) -> tuple[list[str], str, str]:
    """The released generator (facebookresearch/RAM, projects/cope/scripts/count_data_gen.py), its
    retries included, at n statements: (the statements, the printed variable, its value)."""
    while True:  # a program that sets no variable cannot print one: drawn again
        values, statements = {}, []
        for _ in range(n):
            while True:  # an impossible statement is drawn again, kind and variable
                kind = rng.choices(["set", "pass", "increment"], [1, 50, 7])[0]
                if kind == "set":
                    name = rng.choice(LETTERS[:variables])
                    values[name] = 0
                    break
                if kind == "pass":
                    break
                if values:
                    name = rng.choice(list(values))
                    if values[name] < 10:
                        values[name] += 1
                        break
            statements.append(kind)
        if values:
            printed = rng.choice(list(values))
            return statements, printed, str(values[printed])


def law(statements: list[list[str]], printed: list[str], answers: list[str]) -> dict[str, Counter]:
    firsts = Counter(s.index("set") for s in statements)
    kinds = Counter(k for s in statements for k in s)
    return {"answer": Counter(answers), "printed": Counter(printed), "first set": firsts, "kind": kinds}


def programs(task, n: int, samples: int) -> tuple[list[list[str]], list[str], list[str]]:
    batch = task.sample(samples, n, torch.Generator().manual_seed(n))
    texts = [task.to_text(batch, i) for i in range(samples)]
    kinds = [[("pass" if w == "pass;" else "increment" if w == "++;" else "set")
              for w in q.split(" ")[:-3] if w in ("pass;", "++;", "=")] for q, _ in texts]
    return kinds, [q.split(" ")[-2] for q, _ in texts], [a for _, a in texts]


@pytest.mark.parametrize("n, variables", [(5, 3), (40, 3), (120, 1)])
def test_counting_follows_the_released_law(n, variables):
    """The exact redraws against the released retries: every share of the answers, of the first
    set's place and of the statement kinds within 5 standard errors."""
    samples = 6000
    ours = law(*programs(get_task("counting", variables=variables), n, samples))
    rng = random.Random(n)
    theirs = law(*zip(*[released_program(n, variables, rng) for _ in range(samples)]))
    for what in ours:
        total_a, total_b = sum(ours[what].values()), sum(theirs[what].values())
        for key in set(ours[what]) | set(theirs[what]):
            a, b = ours[what][key] / total_a, theirs[what][key] / total_b
            p = (a + b) / 2
            assert abs(a - b) <= 5 * math.sqrt(p * (1 - p) * (1 / total_a + 1 / total_b)) + 1e-3, (what, key, a, b)


def retried_step(values: list[int], is_set: list[bool]) -> dict[tuple[int, int], float]:
    """The released retry loop's law of the next statement, by enumeration: each try draws set
    (1 / 58, any variable), pass (50 / 58) or increment (7 / 58, a variable among the set ones),
    and an increment of an unset or capped variable is tried again."""
    count, set_ = len(values), [v for v in range(len(values)) if is_set[v]]
    law = {(0, v): 1 / 58 / count for v in range(count)}
    law[(1, -1)] = 50 / 58
    for v in set_:
        if values[v] < 10:
            law[(2, v)] = 7 / 58 / len(set_)
    total = sum(law.values())
    return {key: p / total for key, p in law.items()}


@pytest.mark.parametrize("values, is_set", [([10, 3, 0], [True, True, False]), ([10, 10, 4], [True, True, False]),
                                            ([0, 0, 0], [True, True, True]), ([9, 10, 10], [True, True, True]),
                                            ([5, 0, 0], [True, False, False])])
def test_each_statement_follows_the_released_retries(values, is_set):
    task, samples = get_task("counting"), 200_000
    g = torch.Generator().manual_seed(7)
    values, is_set = torch.tensor([values] * samples), torch.tensor([is_set] * samples)
    op = task.statement(values, is_set, torch.rand(samples, generator=g, dtype=torch.float64))
    pick = task.variable(op, values, is_set, torch.rand(samples, generator=g, dtype=torch.float64))
    drawn = Counter(zip(op.tolist(), torch.where(op == 1, -1, pick).tolist()))
    expected = retried_step(values[0].tolist(), is_set[0].tolist())
    assert set(drawn) <= set(expected)
    for key, p in expected.items():
        assert abs(drawn[key] / samples - p) < 5 * math.sqrt(p / samples) + 1e-4, (key, drawn[key] / samples, p)


def test_first_set_follows_the_truncated_geometric_law():
    q, n, samples = 50 / 51, 4, 20000
    statements, _, _ = programs(get_task("counting"), n, samples)
    firsts = Counter(s.index("set") for s in statements)
    for t in range(n):
        expected = q ** t * (1 - q) / (1 - q ** n)
        assert abs(firsts[t] / samples - expected) < 4 * math.sqrt(expected / samples), (t, firsts[t] / samples)


def test_values_reach_the_cap_and_stop_there():
    task = get_task("counting", variables=1)
    batch = task.sample(200, 1000, torch.Generator().manual_seed(6))
    answers = Counter(task.to_text(batch, i)[1] for i in range(200))
    assert "10" in answers and set(answers) <= {str(v) for v in range(11)}
    check_answers(task, batch, 1000, lambda q, n: solve_counting(q, n, 1))  # no increment past 10


@pytest.mark.parametrize("variables", [0, 27, True, 2.5, "3"])
def test_counting_bad_options(variables):
    with pytest.raises(ValueError, match="variables must be an integer in 1..26"):
        get_task("counting", variables=variables)


# ---------------------------------------------------------------- configs

@pytest.mark.parametrize("options, word", [("{blank_ratio=-1.0}", "blank_ratio"), ("{symbols=30}", "symbols"),
                                           ("{blanks=3}", "is not an option of selective_copy")])
def test_bad_selective_copy_options_are_one_line_config_errors(options, word):
    with pytest.raises(ConfigError, match=word) as err:
        new_run_config(None, ["task.name=selective_copy", f"task.options={options}"])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options, word", [("{variables=0}", "variables"), ("{nvars=3}", "is not an option of counting")])
def test_bad_counting_options_are_one_line_config_errors(options, word):
    with pytest.raises(ConfigError, match=word) as err:
        new_run_config(None, ["task.name=counting", f"task.options={options}"])
    assert "\n" not in str(err.value)


def test_the_papers_densities_sweep_in_evaluation():
    cfg = new_run_config(None, ["task.name=selective_copy", "eval.sweep={blank_ratio=[1.0, 0.5, 2.0]}"])
    assert cfg.eval.sweep == {"blank_ratio": [1.0, 0.5, 2.0]}
    with pytest.raises(ConfigError, match="vocabulary"):  # symbols would change it
        new_run_config(None, ["task.name=selective_copy", "eval.sweep={symbols=[8, 16]}"])

"""The lm-evaluation-harness model "lengthgen" (lengthgen/export/harness.py), with the real lm_eval
(the `harness` extra; skipped without it): a local rolling-log-likelihood task over local text
scores a tiny text run, and its byte perplexity is lengthgen's own perplexity of the same tokens;
a continuation's log-likelihood is the sum of the model's token log-probabilities."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import UserError
from lengthgen.evaluation.evaluate import evaluate_run, load_assembled
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.export.export import export_run
from lengthgen.tasks import EOS
from lengthgen.tasks.corpus import split_of
from lengthgen.training.trainer import train

from tests.helpers.documents import lm_overrides, write_documents
from exports import trained

lm_eval = pytest.importorskip("lm_eval", reason="lm_eval is the `harness` extra: pip install 'lengthgen[harness]'")
from lengthgen.export.harness import LengthgenLM, main  # noqa: E402  (registers "lengthgen")

WINDOW = 16
TEXT = ("the window of a model is the length of the query and the key; "
        "attention reads every position of the layer, head by head, token by token.")
TASK = """task: lengthgen_local_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {cache}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def first_test_name(prefix: str) -> str:
    return next(f"{prefix}{i}.txt" for i in range(1000) if split_of(f"{prefix}{i}.txt") == "test")


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A tiny text run on a local corpus whose test split starts with an empty document and then
    TEXT: its token stream reads EOS, TEXT, ..., so `lengthgen eval` with as many samples as TEXT
    has bytes scores exactly TEXT's tokens after an EOS, as the harness does. Also its export."""
    root = tmp_path_factory.mktemp("harness")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LENGTHGEN_DATA", str(root / "cache"))
        folder = root / "docs"
        write_documents(folder)
        (folder / first_test_name("0-empty-")).write_text("")
        (folder / first_test_name("1-text-")).write_text(TEXT)
        cfg = new_run_config("experiments/lm/cpu/text.toml", lm_overrides(
            folder, f"task.train_max={WINDOW}", "train.steps=30", "train.checkpoint_interval=30", "train.device=cpu",
            f"eval.lengths={WINDOW}"))
        train(cfg, root / "run", progress=False)
        export_run(root / "run", root / "run-hf")
        (root / "text.jsonl").write_text(json.dumps({"text": TEXT}) + "\n")
        tasks = root / "tasks"
        tasks.mkdir()
        (tasks / "local_text.yaml").write_text(TASK.format(data=root / "text.jsonl", cache=root / "hf-datasets"))
        yield root


@pytest.fixture
def local_tasks_only(monkeypatch):
    """lm_eval's TaskManager without indexing lm_eval's own tasks (8.6 s of CPU, every time): the
    tests name only their local task, which the include path holds."""
    from lm_eval.tasks import TaskManager
    index = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *args, include_defaults=False, **kwargs:
                        index(self, *args, include_defaults=include_defaults, **kwargs))


def lengthgen_perplexity(run) -> float:
    rows = evaluate_run(run, EvalSettings(lengths=[WINDOW], samples=len(TEXT.encode()), progress=False,
                                          out=run.parent / "eval-out"))
    assert rows[0]["n"] == len(TEXT.encode())
    return rows[0]["perplexity"]


def test_lm_eval_perplexity_of_an_export_is_lengthgens_own(text_run, local_tasks_only):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    run = text_run / "run-hf"
    model = LengthgenLM(run=str(run), device="cpu", batch_size=3)
    out = simple_evaluate(model=model, tasks=["lengthgen_local_text"],
                          task_manager=TaskManager(include_path=str(text_run / "tasks")))
    result = out["results"]["lengthgen_local_text"]
    ours = lengthgen_perplexity(run)
    # bytes tokenizer, ASCII text: a byte is a token, so byte perplexity is token perplexity
    assert result["byte_perplexity,none"] == pytest.approx(ours, rel=1e-5)
    words = len(TEXT.split())
    assert result["word_perplexity,none"] == pytest.approx(ours ** (len(TEXT.encode()) / words), rel=1e-4)
    assert 1.0 < ours < 259


def test_loglikelihood_is_the_sum_of_the_token_log_probabilities(text_run):
    run, model, _ = load_assembled(text_run / "run", torch.device("cpu"))
    lm = LengthgenLM(run=str(text_run / "run"), device="cpu")
    context, continuation = "the model", " window"
    ids = torch.tensor([[EOS] + [b + 3 for b in (context + continuation).encode()]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1], None).double(), -1)[0]
    first = len(context.encode())  # the target at input column c is ids[c + 1]
    by_hand = sum(float(logp[c, ids[0, c + 1]]) for c in range(first, ids.shape[1] - 1))
    greedy = all(int(logp[c].argmax()) == int(ids[0, c + 1]) for c in range(first, ids.shape[1] - 1))
    request = type("Request", (), {"args": (context, continuation)})
    [(ll, is_greedy)] = lm.loglikelihood([request])
    assert ll == pytest.approx(by_hand, abs=1e-4) and is_greedy == greedy
    # within one window: log p(context + continuation) = log p(context) + log p(continuation | context)
    rolling = [type("Request", (), {"args": (t,)}) for t in (context + continuation, context)]
    whole, head = lm.loglikelihood_rolling(rolling)
    assert whole == pytest.approx(head + ll, abs=1e-4)
    text = lm.generate_until([type("Request", (), {"args": ("the ", {"until": [" "], "max_gen_toks": 8})})])[0]
    assert isinstance(text, str) and " " not in text and len(text) <= 8


def test_a_run_that_is_not_a_text_run_or_missing_is_a_one_line_error(tmp_path):
    copy = trained(tmp_path, "copy")
    with pytest.raises(UserError, match="text runs only"):
        LengthgenLM(run=str(copy), device="cpu")
    with pytest.raises(UserError, match="run folder"):
        LengthgenLM(run=str(tmp_path / "nowhere"), device="cpu")
    with pytest.raises(UserError, match="run=RUN"):
        LengthgenLM(device="cpu")


def test_the_command_line_scores_a_run_folder(text_run, local_tasks_only, monkeypatch, capsys):
    """`python -m lengthgen.export.harness run ...` is main() with those arguments: called here, in
    this process, as the missing-run test below calls it."""
    monkeypatch.setattr(sys, "argv", [
        "lengthgen.export.harness", "run", "--model", "lengthgen", "--model_args", f"run={text_run / 'run'}",
        "--device", "cpu", "--batch_size", "2", "--tasks", "lengthgen_local_text",
        "--include_path", str(text_run / "tasks"), "--output_path", str(text_run / "lm-eval-out")])
    assert main() == 0
    out = capsys.readouterr().out
    assert "byte_perplexity" in out and "lengthgen_local_text" in out
    [written] = (text_run / "lm-eval-out").rglob("results_*.json")
    result = json.loads(written.read_text())["results"]["lengthgen_local_text"]
    assert result["byte_perplexity,none"] == pytest.approx(lengthgen_perplexity(text_run / "run"), rel=1e-5)


def test_the_command_line_names_a_missing_run_in_one_line(text_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lengthgen.export.harness", "run", "--model", "lengthgen", "--model_args",
                                      f"run={text_run / 'nowhere'}", "--device", "cpu", "--tasks",
                                      "lengthgen_local_text", "--include_path", str(text_run / "tasks")])
    assert main() == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: run folder")


@pytest.mark.parametrize("args,says", [
    ({"window": -5}, "window must be a positive integer, got -5"),
    ({"window": float("nan")}, "window must be a positive integer, got nan"),
    ({"window": "abc"}, "window must be a positive integer, got 'abc'"),
    ({"window": 0}, "window must be a positive integer, got 0"),
    ({"window": 100_000_000}, "window = 100,000,000 is past what this run could need"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"batch_size": "abc"}, "batch_size must be a positive integer"),
    ({"max_gen_toks": -1}, "max_gen_toks must be a positive integer"),
    ({"windw": 16}, "--model_args has no key 'windw'"),
    ({"device": "gpu"}, "--device 'gpu' is not a device lengthgen runs on"),
])
def test_model_args_are_checked_in_one_line(text_run, args, says):
    """Issue 8: each of these was a traceback (window=100000000 tried to allocate 51 GB), or accepted silently."""
    with pytest.raises(UserError, match=says.replace("(", r"\(")):
        LengthgenLM(run=str(text_run / "run"), **{"device": "cpu", **args})
    assert LengthgenLM(run=str(text_run / "run"), device="cpu", window=4 * WINDOW).scorer.window == 4 * WINDOW


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_one_line(text_run):
    """(the command line turns the model's UserError into one line: test_the_command_line_names_a_missing_run...)"""
    with pytest.raises(UserError, match="--device 'cuda' requested but CUDA is not available"):
        LengthgenLM(run=str(text_run / "run"), device="cuda")


def test_the_run_is_read_from_lm_evals_arguments_for_the_lengthgen_model_only():
    from lengthgen.export.harness import named_run
    assert named_run(["run", "--model", "lengthgen", "--model_args", "run=/a/b,window=4"]) == "/a/b"
    assert named_run(["--model=lengthgen", "--model_args=window=4,run=x"]) == "x"
    assert named_run(["--model", "lengthgen", "--model_args", "window=4"]) is None
    assert named_run(["--model", "hf", "--model_args", "run=x"]) is None

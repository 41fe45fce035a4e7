"""Can a halting head read "done" off a trained looped model's states? Fit one after training.

    python scripts/halting_probe.py RUN [LENGTH ...]

The model is frozen. At every training length its states after iterations 1 ... T(n) + 4 are
averaged over the answer positions and, separately, over the question; an MLP (one hidden
layer of 128) learns "done" (t >= T(n)) from the two, the classes weighted equally. At each
test LENGTH (default 1.5x and 2x the training maximum) a sample is read out at the first
iteration the probe calls done. Prints, per length, how often that is exactly T(n) and the
exact match there next to the oracle's. A probe that fits the training lengths but misses
T(n) beyond them says the states hold no length-general "done" signal for a head to find.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lengthgen.evaluate import eval_batches
from lengthgen.looped import per_sample_steps
from run_args import open_run

EXTRA = 4  # iterations past T(n) in the probe's data: "done" must also hold after the right step


@torch.no_grad()
def features(model, batch):
    """(T(n)_max + EXTRA, B, 2D) pooled states, (T, B) exact match of each read-out."""
    h, e, pos = model.start(batch.blank_answers().inputs, batch.position_ids)
    answer = batch.scored.float()[..., None]
    columns = torch.arange(batch.inputs.shape[1])[None, :, None]
    question = (columns < batch.question_len[:, None, None]).float()
    feats, right = [], []
    for _ in range(int(per_sample_steps(batch).max()) + EXTRA):
        h = model.step(h, e, pos)
        feats.append(torch.cat([(h * answer).sum(1) / answer.sum(1), (h * question).sum(1) / question.sum(1)], -1))
        right.append(((model.read(h).argmax(-1) == batch.targets) | ~batch.scored).all(1))
    return torch.stack(feats), torch.stack(right)


def main() -> None:
    torch.manual_seed(0)
    _, lengths, cfg, task, _, model = open_run("halting_probe", [], looped=True)
    lengths = lengths or [int(1.5 * cfg.task.train_max), 2 * cfg.task.train_max]
    xs, ys = [], []
    for n in range(cfg.task.train_min, cfg.task.train_max + 1):
        batch = task.sample(256, n, torch.Generator().manual_seed(n))  # not the test seed
        x, _ = features(model, batch)
        t = torch.arange(1, len(x) + 1)[:, None]
        xs.append(x.flatten(0, 1))
        ys.append((t >= per_sample_steps(batch)[None]).float().flatten())
    x, y = torch.cat(xs), torch.cat(ys)
    mean, std = x.mean(0), x.std(0) + 1e-6
    probe = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 128), torch.nn.GELU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.Adam(probe.parameters(), 1e-2)
    weight = (1 - y).sum() / y.sum()
    for _ in range(1000):
        loss = F.binary_cross_entropy_with_logits(probe((x - mean) / std)[:, 0], y, pos_weight=weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"probe trained on lengths {cfg.task.train_min}-{cfg.task.train_max}: loss {float(loss.detach()):.4f}")
    print("| length | stops at T(n) | exact match at the probe's step | at T(n) (oracle) |\n|---:|---:|---:|---:|")
    for n in [cfg.task.train_max, *lengths]:
        batch = next(eval_batches(task, n, 512, 512, cfg.eval.seed, torch.device("cpu")))
        x, right = features(model, batch)
        with torch.no_grad():
            done = probe((x - mean) / std)[..., 0] > 0
        first = torch.where(done.any(0), done.float().argmax(0), len(x) - 1)  # (B,) 0-based
        steps = per_sample_steps(batch)
        print(f"| {n} | {(first + 1 == steps).float().mean():.3f} | {right.gather(0, first[None])[0].float().mean():.3f}"
              f" | {right.gather(0, (steps - 1)[None])[0].float().mean():.3f} |")


if __name__ == "__main__":
    main()

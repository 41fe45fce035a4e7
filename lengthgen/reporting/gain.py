"""The report's sparse-dependence section (figure kind `gain_by_sparsity`): how much of a long
context's benefit a model trained on short windows gets, by how many far tokens that benefit
depends on (docs/sparsity.md, "Sparse dependence in natural language").

It combines runs: a reference arm (M_long, evaluated with eval.dependence: RUN/dependence.csv
holds D(t), the long-context tokens T* and their k(t)) and every other run with per-token losses
(RUN/token_loss.csv, an M_short variant), paired by task and seed. For a short run and its
reference, over the tokens of T* (D > tau, or the top_p % of D with `select = "top"`):
    G(t) = loss_short(t; near) - loss_short(t; full)
and per bucket of k, G/D = sum G / sum D (a ratio of sums: tokens weigh by their benefit, and
a token with a tiny D cannot blow it up). Each seed gives one ratio per bucket; the tables show
their mean ± standard error over seeds with the tokens per seed. "all" is the ratio over all of
T*: if G/D did not depend on k, every bucket would sit near it. "first - last" is the ratio of
the sparsest bucket minus that of the densest, per seed, then mean ± s.e.: the fall, if any,
against the seeds' noise.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from lengthgen.errors import UserError
from lengthgen.results.token_files import DEPENDENCE, TOKEN_EVAL, TOKEN_LOSS, read_dependence, read_token_losses
from lengthgen.reporting.figures import _pyplot

DEFAULT_BUCKETS = [1, 2, 4, 8]  # upper edges: k = 1, 2, 3-4, 5-8, > 8
SELECTIONS = ("tau", "top")


def bucket_names(edges: list[int]) -> list[str]:
    names, low = [], 1
    for edge in edges:
        names.append(f"{edge}" if edge == low else f"{low}–{edge}")
        low = edge + 1
    return names + [f"> {edges[-1]}"]


def bucket_of(k: np.ndarray, edges: list[int]) -> np.ndarray:
    """Index of each k's bucket: k <= edges[0] -> 0, ..., k > edges[-1] -> len(edges)."""
    return np.searchsorted(np.asarray(edges), k, side="left")


def mean_se(values: list[float]) -> tuple[float, float]:
    x = np.array([v for v in values if math.isfinite(v)], dtype=float)
    if not len(x):
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else math.nan


def cell(mean: float, se: float, extra: str = "") -> str:
    if not math.isfinite(mean):
        return "–"
    return f"{mean:.3f}" + (f" ± {se:.3f}" if math.isfinite(se) else "") + extra


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is unreadable ({err}); evaluate the run again") from None


def runs(rows: list[dict]) -> dict[str, dict]:
    """{run folder: {task, arm, seed}} from the report's rows."""
    out = {}
    for r in rows:
        out.setdefault(r["source"], {"task": r["task"], "arm": r.get("arm", ""), "seed": r["seed"]})
    return out


def pairs(rows: list[dict], reference: str) -> tuple[dict, list[tuple[str, str]]]:
    """({(task, seed): reference folder}, [(short folder, its reference folder)]): the reference runs
    are those of arm `reference` (or the one run folder of that name), every other run with a
    token_loss.csv is paired with the reference of its task and seed (or the single reference)."""
    known = runs(rows)
    refs = {(v["task"], v["seed"]): f for f, v in known.items() if v["arm"] == reference}
    if not refs:
        named = [f for f in known if Path(f).name == reference or f == reference]
        if not named:
            raise UserError(f"the gain_by_sparsity figure names reference {reference!r}, which is neither an arm nor "
                            "a run of this report")
        refs = {(known[named[0]]["task"], None): named[0]}
    for folder in refs.values():
        if not (Path(folder) / DEPENDENCE).is_file():
            raise UserError(f"{folder} is the reference but holds no {DEPENDENCE} (evaluate it with eval.dependence = true)")
    out = []
    for folder, v in sorted(known.items()):
        if folder in refs.values() or not (Path(folder) / TOKEN_LOSS).is_file():
            continue
        ref = refs.get((v["task"], v["seed"])) or refs.get((v["task"], None))
        if ref is not None:
            out.append((folder, ref))
    return refs, out


def gains(short: str, ref: str, edges: list[int], select: str) -> dict:
    """One short run against its reference: per bucket (and "all") sum G, sum D, tokens."""
    cost = read_json(Path(ref) / TOKEN_EVAL).get("dependence", {})
    near, full = cost.get("near"), cost.get("full")
    try:
        dep = read_dependence(Path(ref) / DEPENDENCE)
        losses = read_token_losses(Path(short) / TOKEN_LOSS)
    except (OSError, ValueError) as err:
        raise UserError(str(err)) from None
    for c in (near, full):
        if f"loss_{c}" not in losses:
            raise UserError(f"{short}/{TOKEN_LOSS} has no loss at context {c}, which its reference {ref} measured "
                            "its dependence with; give both runs the same eval.token_contexts")
    where = {(d, p): i for i, (d, p) in enumerate(zip(losses["document"].tolist(), losses["position"].tolist()))}
    chosen = [r for r in dep if (r["in_tau"] if select == "tau" else r["in_top"])]
    missing = [r for r in chosen if (r["document"], r["position"]) not in where]
    if missing:
        raise UserError(f"{short} did not score the token at document {missing[0]['document']}, position "
                        f"{missing[0]['position']}, which its reference {ref} did; give both the same eval.token_* settings")
    at = np.array([where[(r["document"], r["position"])] for r in chosen], dtype=np.int64)
    if len(at) and np.any(losses["token"][at] != np.array([r["token"] for r in chosen])):
        raise UserError(f"{short} and its reference {ref} scored different tokens (another corpus?)")
    g = losses[f"loss_{near}"][at] - losses[f"loss_{full}"][at] if len(at) else np.zeros(0)
    d = np.array([r["delta"] for r in chosen], dtype=float)
    b = bucket_of(np.array([r["k"] for r in chosen], dtype=np.int64), edges)
    out = {i: (float(g[b == i].sum()), float(d[b == i].sum()), int((b == i).sum())) for i in range(len(edges) + 1)}
    out["all"] = (float(g.sum()), float(d.sum()), len(g))
    out["mean_g"] = float((losses[f"loss_{near}"] - losses[f"loss_{full}"]).mean())  # over every scored token
    # the mirror of T*: tokens the far context *hurts* by more than tau. Where it hurts about as often
    # as it helps, G/D there says how much two models agree on far context that carries nothing
    ref = read_token_losses(Path(ref) / TOKEN_LOSS)
    same = (len(ref["document"]) == len(losses["document"]) and np.array_equal(ref["document"], losses["document"])
            and np.array_equal(ref["position"], losses["position"]))
    tau = cost.get("settings", {}).get("tau", 0.0)
    if same:
        d_all = ref[f"loss_{near}"] - ref[f"loss_{full}"]
        g_all = losses[f"loss_{near}"] - losses[f"loss_{full}"]
        hurt = d_all < -tau
        out["mirror"] = (float(g_all[hurt].sum()), float(d_all[hurt].sum()), int(hurt.sum()))
    else:
        out["mirror"] = (math.nan, math.nan, 0)
    return out


def table(series: dict[str, dict], edges: list[int]) -> str:
    """Markdown: a row per series, G/D per bucket (tokens per seed), all of T*, first - last."""
    names = bucket_names(edges)
    lines = ["| series | seeds | " + " | ".join(f"k {n}" if n.startswith(">") else f"k = {n}" for n in names)
             + " | all of T* | first − last | mirror: Δ < −τ | mean G, all tokens |",
             "|---|---:|" + "---:|" * (len(names) + 4)]
    for label, per_seed in series.items():
        cells = []
        for i in list(range(len(names))) + ["all"]:
            ratios = [s[i][0] / s[i][1] if s[i][1] > 0 else math.nan for s in per_seed]
            tokens = sum(s[i][2] for s in per_seed)
            cells.append(cell(*mean_se(ratios), f" ({tokens})"))
        falls = [s[0][0] / s[0][1] - s[len(names) - 1][0] / s[len(names) - 1][1]
                 if s[0][1] > 0 and s[len(names) - 1][1] > 0 else math.nan for s in per_seed]
        mirror = [s["mirror"][0] / s["mirror"][1] if s["mirror"][1] < 0 else math.nan for s in per_seed]
        tokens = sum(s["mirror"][2] for s in per_seed)
        lines.append(f"| {label} | {len(per_seed)} | " + " | ".join(cells) + f" | {cell(*mean_se(falls))} | "
                     f"{cell(*mean_se(mirror), f' ({tokens})')} | {cell(*mean_se([s['mean_g'] for s in per_seed]))} |")
    return "\n".join(lines) + "\n"


def plot_gain(series: dict[str, dict], colors: dict[str, str], edges: list[int], path: Path, title: str) -> None:
    plt = _pyplot()
    names = bucket_names(edges)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    x = np.arange(len(names))
    for n, (label, per_seed) in enumerate(series.items()):
        stats = [mean_se([s[i][0] / s[i][1] if s[i][1] > 0 else math.nan for s in per_seed]) for i in range(len(names))]
        mean = np.array([m for m, _ in stats])
        err = np.nan_to_num(np.array([e for _, e in stats]))
        shift = (n - (len(series) - 1) / 2) * 0.06  # error bars side by side
        ax.errorbar(x + shift, mean, yerr=err, marker="o", capsize=3, label=label, color=colors.get(label))
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(1, color="grey", lw=0.8, ls="--")
    lows = [m for per_seed in series.values() for s in per_seed for i in range(len(names))
            if s[i][1] > 0 and (m := s[i][0] / s[i][1]) < -2]
    if lows:  # a control far below 0 would flatten the others: linear on [-1, 1], logarithmic beyond
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xticks(x, names)
    ax.set_xlabel("k: far tokens the long model needs to recover its benefit")
    ax.set_ylabel("G / Δ  (short model's gain / long model's)" + ("; symlog" if lows else ""))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_delta(refs: list[str], edges: list[int], select: str, path: Path) -> dict:
    """Two panels: the distribution of D over every scored token (pooled over the reference runs),
    and the tokens of T* per bucket of k. Returns the settings the reference runs measured with."""
    plt = _pyplot()
    deltas, ks, settings = [], [], {}
    for ref in refs:
        cost = read_json(Path(ref) / TOKEN_EVAL).get("dependence", {})
        settings = cost.get("settings", settings)
        losses = read_token_losses(Path(ref) / TOKEN_LOSS)
        deltas.append(losses[f"loss_{cost['near']}"] - losses[f"loss_{cost['full']}"])
        ks += [r["k"] for r in read_dependence(Path(ref) / DEPENDENCE) if (r["in_tau"] if select == "tau" else r["in_top"])]
    delta = np.concatenate(deltas)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.4))
    a.hist(delta, bins=120, color="#4477aa")
    a.set_yscale("log")
    if settings.get("tau") is not None:
        a.axvline(settings["tau"], color="#cc3311", ls="--", label=f"τ = {settings['tau']:g}")
        a.legend(fontsize=8)
    a.set_xlabel("Δ(t) = loss(t; near) − loss(t; full), nats")
    a.set_ylabel("tokens (all seeds)")
    counts = np.bincount(bucket_of(np.array(ks, dtype=np.int64), edges), minlength=len(edges) + 1)
    b.bar(np.arange(len(counts)), counts, color="#228833")
    b.set_xticks(np.arange(len(counts)), bucket_names(edges))
    b.set_xlabel("k")
    b.set_ylabel("tokens of T* (all seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    tau = settings.get("tau", 0.0)
    return {**settings, "tokens": len(delta), "mean": float(delta.mean()), "above": float((delta > tau).mean()),
            "below": float((delta < -tau).mean())}


def example_tokens(ref: str, count: int, select: str) -> tuple[list[dict], object, np.ndarray, dict]:
    """The `count` tokens of T* with the largest D among the sparsest (k <= 4 first), with the
    reference's corpus and test stream to draw them."""
    from lengthgen.assembly.runs import saved_run
    from lengthgen.evaluation.language_model import documents

    cost = read_json(Path(ref) / TOKEN_EVAL).get("dependence", {})
    dep = [r for r in read_dependence(Path(ref) / DEPENDENCE) if (r["in_tau"] if select == "tau" else r["in_top"])]
    dep.sort(key=lambda r: (r["k"] > 4, -r["delta"]))
    task = saved_run(Path(ref) / "config.toml").task
    stream = task.corpus.tokens("test")
    starts, _ = documents(stream)
    picked = dep[:count]
    for r in picked:
        r["index"] = int(starts[r["document"]] + r["position"])
    return picked, task.corpus, stream, cost


def shown(text: str) -> str:
    return text.replace("\n", "⏎").replace("\t", "→").replace("\r", "␍") or "·"


def ranking(refs: list[str], select: str) -> str:
    """Markdown: k under the ranking against k with the far tokens in a random order (the baseline
    that says whether the ranking finds the tokens that matter), pooled over the reference runs."""
    rows = [r for ref in refs for r in read_dependence(Path(ref) / DEPENDENCE)
            if (r["in_tau"] if select == "tau" else r["in_top"])]
    if not rows or min(r["k_random"] for r in rows) < 0:
        return ""
    ranked, random = np.array([r["k"] for r in rows]), np.array([r["k_random"] for r in rows])
    far = read_json(Path(refs[0]) / TOKEN_EVAL)["dependence"]
    return ("| far tokens ordered by | median k | mean k | k ≤ 2 | k ≤ 8 | of far tokens |\n|---|---:|---:|---:|---:|---:|\n"
            + "".join(f"| {name} | {np.median(k):.0f} | {k.mean():.1f} | {100 * (k <= 2).mean():.1f} % | "
                      f"{100 * (k <= 8).mean():.1f} % | {far['full'] - far['near']} |\n"
                      for name, k in ((far["settings"]["rank"], ranked), ("random order (baseline)", random))))


def plot_examples(ref: str, count: int, select: str, path: Path, width: int = 64) -> list[str]:
    """A panel per example: the `full` tokens before t, wrapped at `width` characters; the near
    window on grey, the far tokens kept (k(t) of them) on orange, the token t itself boxed.
    Returns a plain-text rendering of each: far tokens kept in [brackets], the near window
    after `|`, the token predicted in ⟨ ⟩."""
    picked, corpus, stream, cost = example_tokens(ref, count, select)
    if not picked:
        return []
    near, full = cost["near"], cost["full"]
    plt = _pyplot()
    lines_per = [0] * len(picked)
    pieces_per, texts = [], []
    for i, r in enumerate(picked):
        t, kept = r["index"], {r["index"] - d for d in r["far"]}
        pieces, col, row = [], 0, 0
        for j in range(t - full, t + 1):
            piece = shown(corpus.decode([int(stream[j])]))
            if col + len(piece) > width:
                col, row = 0, row + 1
            kind = "target" if j == t else "kept" if j in kept else "near" if j >= t - near else "far"
            pieces.append((col, row, piece, kind))
            col += len(piece)
        pieces_per.append(pieces)
        lines_per[i] = row + 1
        text = "".join(f"[{p}]" if k == "kept" else (f"|{p}" if k == "near" and pieces[n - 1][3] != "near" else
                                                     f"⟨{p}⟩" if k == "target" else p)
                       for n, (_, _, p, k) in enumerate(pieces))
        texts.append(f"Δ = {r['delta']:.2f} nats, k = {r['k']} (distances {', '.join(map(str, r['far']))}): {text}")
    heights = [0.5 + 0.22 * n for n in lines_per]
    fig, axes = plt.subplots(len(picked), 1, figsize=(0.08 * width + 0.6, sum(heights) + 0.3),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    colors = {"near": "#dddddd", "kept": "#ee7733", "target": "#ffffff", "far": None}
    for ax, r, pieces, n in zip(axes[:, 0], picked, pieces_per, lines_per):
        ax.set_xlim(0, width)
        ax.set_ylim(n, -0.2)
        ax.axis("off")
        for col, row, piece, kind in pieces:
            if colors[kind]:
                ax.add_patch(plt.Rectangle((col, row - 0.05), len(piece), 0.9, color=colors[kind], lw=0))
            if kind == "target":
                ax.add_patch(plt.Rectangle((col, row - 0.05), len(piece), 0.9, fill=False, ec="#cc3311", lw=1.5))
            ax.text(col, row + 0.45, piece, family="monospace", fontsize=8, va="center", ha="left")
        ax.set_title(f"Δ = {r['delta']:.2f} nats, k = {r['k']}: red box = the token; grey = near {near}; "
                     f"orange = far tokens kept", fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return texts


def costs(refs: list[str], shorts: list[str]) -> str:
    """Markdown: what the per-token evaluation and the search for k cost, per run."""
    lines = ["| run | scored tokens | passes per token | tokens run per scored token | s per 1,000 scored | "
             "T* searched | rank passes | bisection passes per token | s per 1,000 searched |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for folder in sorted(set(refs) | set(shorts)):
        data = read_json(Path(folder) / TOKEN_EVAL) if (Path(folder) / TOKEN_EVAL).is_file() else {}
        tl, dep = data.get("token_losses", {}), data.get("dependence")
        if not tl:
            continue
        n = max(tl["tokens"], 1)
        row = f"| {Path(folder).name} | {tl['tokens']} | {tl['passes'] / n:.0f} | {tl['positions'] / n:.0f} | " \
              f"{tl['seconds_per_1000_tokens']:.1f} |"
        if dep:
            m = max(dep["tokens"], 1)
            row += f" {dep['tokens']} | {dep['rank_passes']} | {dep['bisection_passes'] / m:.1f} | " \
                   f"{dep['seconds_per_1000_tokens']:.1f} |"
        else:
            row += " – | – | – | – |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def section(spec: dict, rows: list[dict], agg: list[dict], out: Path) -> list[str]:
    """The report's text for one gain_by_sparsity figure, with its figures written into `out`."""
    from lengthgen.reporting.curves import runs_by_series

    reference, edges = spec["reference"], list(spec.get("buckets", DEFAULT_BUCKETS))
    select, count = spec.get("select", "tau"), spec.get("examples", 4)
    if select not in SELECTIONS:
        raise UserError(f"gain_by_sparsity select {select!r} is unknown; choose from {', '.join(SELECTIONS)}")
    if not edges or any(not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in edges) or edges != sorted(set(edges)):
        raise UserError(f"gain_by_sparsity buckets must be increasing integers >= 1, got {edges!r}")
    refs, paired = pairs(rows, reference)
    if not paired:
        return [f"(no run with {TOKEN_LOSS} to compare with reference {reference})", ""]
    by_series = runs_by_series(rows, agg)
    label_of, colors = {}, {}
    for (task, _), entry in by_series.items():
        for folder in entry["runs"]:
            label_of[folder] = entry["label"] if len({t for t, _ in by_series}) == 1 else f"{task} {entry['label']}"
            colors[label_of[folder]] = entry["color"]
    text = ["## Long-context gain by dependence sparsity", ""]
    for sel in [select] + [s for s in SELECTIONS if s != select]:
        series = defaultdict(list)
        for short, ref in paired:
            series[label_of[short]].append(gains(short, ref, edges, sel))
        if sel == select:
            plot_gain(series, colors, edges, out / "gain_by_sparsity.png",
                      f"G/Δ by k, mean ± s.e. over seeds (reference: {reference}; T* by {'Δ > τ' if sel == 'tau' else 'top p %'})")
        what = "Δ > τ" if sel == "tau" else "the top p % of Δ"
        text += [f"### T* = tokens with {what}", "",
                 "G/Δ = Σ G / Σ Δ over the tokens of T* in each bucket of k (k from the reference model), mean ± "
                 "standard error over the seeds with tokens in that bucket (tokens of all seeds in brackets); "
                 "`all of T*`: the ratio over every bucket; "
                 "`first − last`: the sparsest bucket's ratio minus the densest's, per seed; `mirror: Δ < −τ`: the "
                 "same ratio over the tokens the far context hurts (where it hurts as often as it helps, a ratio "
                 "there as large as on T* is two models agreeing on far context that carries nothing); `mean G, all "
                 "tokens`: each model's mean loss(near) − loss(full) over every scored token.", "", table(series, edges)]
        if sel == select:
            text += ["![G/Δ by k](gain_by_sparsity.png)", ""]
    stats = plot_delta(sorted(refs.values()), edges, select, out / "delta_distribution.png")
    text += ["### The long model's benefit Δ and its sparsity k", "",
             f"{stats['tokens']} scored tokens over the reference runs; mean Δ {stats['mean']:.4f} nats; "
             f"{100 * stats['above']:.1f} % have Δ > τ and {100 * stats['below']:.1f} % Δ < −τ (where the far context "
             "hurts as often as it helps, the part of T* that is noise is about as large as the second share). "
             f"Settings: τ = {stats.get('tau')}, top p = {stats.get('top_p')} %, ε = {stats.get('epsilon')}, far "
             f"tokens ranked by {stats.get('rank')}.", "", ranking(sorted(refs.values()), select), "",
             "![distribution of Δ and of k](delta_distribution.png)", ""]
    examples = plot_examples(min(refs.values()), count, select, out / "sparse_examples.png") if count else []
    if examples:
        text += ["### Examples", "", f"Tokens of T* of {Path(min(refs.values())).name} (the sparsest first, then the "
                 "largest Δ). In the figure the token predicted is boxed, its near window grey and the far tokens "
                 "kept orange; below, the kept far tokens in [brackets], the near window after `|`, the token in ⟨ ⟩.",
                 "", "![examples](sparse_examples.png)", "", "```"] + examples + ["```", ""]
    text += ["### Cost", "", costs(list(refs.values()), [s for s, _ in paired])]
    return text

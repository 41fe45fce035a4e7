"""The TRA paper presets (experiments/tra/paper/*.toml, experiments/lm/paper/text.toml) against
the tables of docs/tra.md, "Paper presets, the paper and the notebook": every row's value held
by the loaded preset, every key a preset sets documented. Beside the tables, the notebook's own
definitions, written here independently of them: 6,160 bias parameters in the TRA mini block
(none in q, k, v), the embedding uniform in +-0.01 with the PAD row zero, the read-out N(0, 0.02)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.methods.registry import get_method
from lengthgen.tasks import PAD, task_of
from tests.helpers.preset_tables import doc_section, doc_tables, drift, expected, undocumented

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tra.md"
SECTION = "## Paper presets, the paper and the notebook"
COMMON = "All TRA paper presets"
PRESETS = ("experiments/tra/paper/flipflop.toml", "experiments/tra/paper/copy_symbols.toml",
           "experiments/tra/paper/induct.toml", "experiments/lm/paper/text.toml")
REQUIRED = {  # the settings every preset's tables must give, whether the preset sets them or not
    "method", "task.name", "task.train_min", "task.train_max", "model.d_model", "model.n_layer", "model.n_head",
    "model.mlp", "model.mlp_ratio", "model.norm", "model.residual", "model.bias", "model.qkv_bias",
    "model.attn_dropout", "model.attn_dropout_on", "model.mlp_dropout", "model.embed_dropout", "model.dropout",
    "model.init", "model.tie_embeddings", "train.steps", "train.batch_size", "optim.lr", "optim.weight_decay",
    "optim.decay_all", "optim.betas", "optim.grad_clip", "optim.schedule", "optim.warmup_steps",
    "eval.lengths", "eval.samples"}


def documented(preset: str) -> dict:
    return expected(doc_tables(DOC, SECTION), COMMON, preset)


def test_every_tra_paper_preset_has_a_table_and_the_rest_is_listed():
    assert sorted(str(p.relative_to(ROOT)) for p in (ROOT / "experiments" / "tra" / "paper").glob("*.toml")) == \
        sorted(p for p in PRESETS if p.startswith("experiments/tra"))
    assert len(doc_tables(DOC, SECTION)) == len(PRESETS) + 1
    assert "\n### Still different\n" in doc_section(DOC, SECTION)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_holds_every_documented_value_and_documents_every_key(preset):
    table = documented(preset)
    wrong = drift(ROOT / preset, table)
    assert not wrong, f"{preset}: " + "; ".join(wrong)
    extra = undocumented(ROOT / preset, table)
    assert not extra, f"{preset} sets undocumented keys {sorted(extra)}"
    assert not REQUIRED - set(table), f"docs/tra.md lacks {sorted(REQUIRED - set(table))} for {preset}"
    assert 'docs/tra.md, "Paper presets, the paper and the notebook"' in (ROOT / preset).read_text()


@pytest.mark.parametrize("preset", PRESETS[:3])
def test_the_mini_block_is_the_notebooks(preset):
    """From the notebook: per layer, biases on the output projection (256), the SwiGLU's linear and
    gate units (2 x 512) and output (256), and TRA's gate (4 heads): 4 x 1,540 = 6,160."""
    cfg = new_run_config(ROOT / preset, ["model.position=tra"])
    torch.manual_seed(0)
    model = get_method(cfg.method).build_model(cfg, task_of(cfg.task))
    biases = {name: p.numel() for name, p in model.named_parameters() if name.endswith("bias")}
    assert sum(biases.values()) == 4 * (256 + 2 * 512 + 256 + 4) == 6160
    assert not any("c_attn" in name for name in biases)  # q, k, v bias-free
    embedding, head = model.wte.weight.detach(), model.lm_head.weight.detach()
    assert embedding.abs().max() <= 0.01 and embedding.abs().max() > 0.009 and (embedding[PAD] == 0).all()
    assert head is not embedding and abs(head.std().item() - 0.02) < 0.002 and abs(head.mean().item()) < 0.002
    assert model.blocks[0].mlp.c_fc.bias.abs().max() > 0  # the blocks keep torch's defaults: nonzero biases

"""The paper presets of `reproduce coupling` (experiments/coupling/paper/*.toml) with the grid's coupled arm
at paper scale, against Cho et al.'s released scripts (HanseulJo/position-coupling at b9cad94:
scripts/multiple_addition/run_scratchpad_coupled_ape.sh, scripts/multiplication/run_scratchpad_coupled_ape.sh,
configs/training/default.yaml), the values written out here independently of the presets; and the CPU
presets with every arm assemble."""
from __future__ import annotations

import pytest

from lengthgen.assembly.runs import new_run
from lengthgen.reproduction import grid

# task: their script's values. n_train/m_train and n_test (the 2x test range), layers, heads, d_model, d_ff,
# lr, batch, steps, samples, the starts' ranges (max_position_digits, max_position_operands per level)
RELEASED = {
    "multi_operand_addition": dict(digits=(1, 10), count=[2, 10], layers=6, heads=8, width=1024, d_ff=2048, lr=3e-5,
                                   batch=400, steps=50_000, samples=500_000, starts=40, table=41, levels=2),
    "long_multiplication": dict(digits=(1, 10), count=[1, 10], layers=6, heads=8, width=1024, d_ff=2048, lr=5e-5,
                                batch=250, steps=50_000, samples=500_000, starts=[70, 35, 70], table=71, levels=3),
}
COUNT = {"multi_operand_addition": "operands", "long_multiplication": "multiplier"}


def loaded(scale: str, task: str, arm: str):
    coupling = grid.find("coupling")
    return new_run(coupling.preset(scale, task), grid.arm_overrides(coupling, scale, task, arm, {}))


@pytest.mark.parametrize("task", RELEASED)
def test_the_paper_presets_are_their_scripts(task):
    r, cfg = RELEASED[task], loaded("paper", task, "coupled").cfg
    m, o = cfg.model, cfg.optim
    assert (cfg.task.train_min, cfg.task.train_max) == r["digits"] and cfg.task.options[COUNT[task]] == r["count"]
    assert (m.n_layer, m.n_head, m.d_model, m.mlp_ratio * m.d_model) == (r["layers"], r["heads"], r["width"], r["d_ff"])
    assert (m.norm, m.residual, m.mlp, m.init, m.attn_scale, m.bias) == ("rmsnorm", "pre-and-post-norm", "gated-gelu",
                                                                         "t5", False, False)
    assert (o.lr, o.weight_decay, o.betas, o.grad_clip, o.schedule, o.min_lr_ratio) == (r["lr"], 0.0, [0.9, 0.95], 1.0,
                                                                                       "cosine", 0.1)
    assert o.warmup_steps == r["steps"] // 100  # warmup_ratio 0.01
    assert (cfg.train.batch_size, cfg.train.steps, cfg.data.dataset_size) == (r["batch"], r["steps"], r["samples"])
    d = cfg.data.position_transform_options
    assert cfg.data.position_transform == "random_offset" and d["keep_zero"] and d["max_position"] == r["starts"]
    assert m.max_positions == r["table"] and m.position_options == {"levels": r["levels"], "std": 1.0}
    assert cfg.task.options["bos"] and cfg.task.options.get("eos", True)  # bos_to_eos, eos: true


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_arm_of_every_task_assembles(scale):
    coupling = grid.find("coupling")
    for task, spec in coupling.pick(scale).data["tasks"].items():
        for arm in spec["only"]:
            run = new_run(coupling.preset(scale, task), grid.arm_overrides(coupling, scale, task, arm, {}))
            assert run.cfg.task.name == task and (arm.startswith("coupled") or run.task.id_levels == 1)

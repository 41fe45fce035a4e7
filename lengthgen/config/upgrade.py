"""Keys of earlier versions, in today's: a preset or a saved run folder written before a key moved
still loads (lengthgen.config.schema.read applies `upgrade` to every file and saved config it reads;
a `--set` of a moved key is refused with the key's new name, from MOVED). Plain dicts, no schema.
"""
from __future__ import annotations

# where each moved key went;
# model.rope_theta moved on 2026-11-23; the methods' loss weights, and the [train] table's split into train, optim,
# data and tests (TRAIN_SPLIT), on 2026-11-27: run folders written since never hold them
TRAIN_SPLIT = {**{k: f"optim.{k}" for k in ("lr", "weight_decay", "decay_all", "betas", "grad_clip", "schedule",
                                            "warmup_steps", "min_lr_ratio", "cosine_start", "ema", "ema_start")},
               **{k: f"data.{k}" for k in ("curriculum_start", "curriculum_interval", "length_sampling",
                                           "dataset_size", "position_transform", "position_transform_options")},
               "data_seed": "data.seed", "data_shards": "data.shards",
               **{f"test_{k}": f"tests.{k}" for k in ("interval", "lengths", "samples", "stops", "options", "offset")}}
MOVED = {"model.rope_theta": "model.position_options.theta", "train.id_loss_weight": "method_options.id_loss_weight",
         "train.halt_loss_weight": "method_options.halt_loss_weight",
         **{f"train.{old}": new for old, new in TRAIN_SPLIT.items()}}
# the method settings that were train.* keys, at their default then: a saved config lists every key, so a
# run of another method carries them at this value, which is dropped, not moved
METHOD_KEYS_WERE = {"id_loss_weight": 1.0, "halt_loss_weight": 1.0}


def upgrade(data: dict) -> dict:
    """A preset or saved config of an earlier version, in today's keys: model.rope_theta
    became RoPE's own option on 2026-11-23 (dropped for other schemes, which never read it);
    train.id_loss_weight and train.halt_loss_weight became method_options on 2026-11-27 (dropped
    at their old default, which every saved config lists); the [train] table split on 2026-11-27
    (TRAIN_SPLIT; a key the new table also sets keeps the new table's value). Kept for run folders
    written before then; remove when none is left to resume."""
    train = data.get("train")
    if isinstance(train, dict) and any(k in train for k in METHOD_KEYS_WERE):
        train = dict(train)
        moved = {k: train.pop(k) for k in METHOD_KEYS_WERE if k in train}
        moved = {k: v for k, v in moved.items() if v != METHOD_KEYS_WERE[k]}
        options = data.get("method_options", {})
        data = {**data, "train": train, "method_options": {**moved, **options} if isinstance(options, dict) else options}
    if isinstance(train, dict) and any(k in train for k in TRAIN_SPLIT):
        data = _split_train(data)
    model = data.get("model")
    if isinstance(model, dict) and "rope_theta" in model:
        model = dict(model)
        theta = model.pop("rope_theta")
        if model.get("position") == "rope" and theta != 10000.0:  # 10000 is RoPE's default
            model["position_options"] = {"theta": theta, **model.get("position_options", {})}
        data = {**data, "model": model}
    return data


def _split_train(data: dict) -> dict:
    """The keys TRAIN_SPLIT moved out of [train], each into its own table under its new name."""
    data, train = dict(data), dict(data["train"])
    for old, new in TRAIN_SPLIT.items():
        if old in train:
            section, key = new.split(".")
            table = data.get(section, {})
            if isinstance(table, dict):
                data[section] = {key: train.pop(old), **table}
    data["train"] = train
    return data

"""`ppc`: Predictive Position Coupling (Golowich et al., ICML 2025), next-token prediction that also
predicts each next token's coupled position ID, decoded greedily with those IDs."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lengthgen.methods.base import Method, loss_weight
from lengthgen.model.positions import SCHEMES
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import IGNORE


class PredictivePositionCoupling(Method):
    """Next-token prediction plus a second head on the same hidden state that predicts the
    position ID of the next token, trained on the task's coupled IDs (`Batch.target_ids`)
    with cross-entropy added to the token loss times its option `id_loss_weight` (method_options). At inference
    every generated token takes the ID the model predicted for it: greedy decoding with a
    KV cache (lengthgen.model.generate), so exact match is that of real generation."""

    name = "ppc"
    needs_target_ids = True
    metric_names = ("id_accuracy",)

    def __init__(self, cfg=None, id_loss_weight: float = 1.0):
        super().__init__(cfg)
        self.id_loss_weight = loss_weight("id_loss_weight", id_loss_weight)

    @classmethod
    def check(cls, cfg, task, transform, scheme):
        """The task supplies the next IDs, the transform moves them with the rest, the scheme decodes
        with a KV cache and shows the model where a random start put the IDs."""
        super().check(cfg, task, transform, scheme)
        batch = task.sample(2, cfg.task.train_min, torch.Generator().manual_seed(0))
        if batch.target_ids is None:
            raise ValueError(f"method {cfg.method} predicts coupled position IDs, which {task.name} with options "
                             f"{cfg.task.options or '{}'} does not supply (is there a coupled option?)")
        if not transform.shifts_all_ids:
            raise ValueError(f"method {cfg.method} needs a data.position_transform that moves a next token's ID "
                             f"with the rest (none or random_offset), not {transform.name}")
        if not scheme.cacheable():
            cached = [name for name, s in SCHEMES.items() if s.cacheable()]
            raise ValueError(f"method {cfg.method} decodes with a KV cache, which model.position {cfg.model.position} "
                             f"cannot use; use {', '.join(cached)}")
        # the ID head names absolute IDs: a scheme that never adds them to the input (RoPE sees only
        # differences) cannot tell one random start from another, so its targets become guesses
        if transform.random_start and not scheme.adds_ids:
            absolute = [name for name, s in SCHEMES.items() if s.adds_ids]
            raise ValueError(f"method {cfg.method} predicts absolute position IDs, which model.position "
                             f"{cfg.model.position} never shows the model, so data.position_transform "
                             f"{transform.name} makes them unpredictable; use {' or '.join(absolute)} positions, "
                             "or no transform")

    def build_model(self, cfg, task):
        model = Transformer(cfg.model, task.vocab_size)
        model.id_head = nn.Linear(cfg.model.d_model, cfg.model.max_positions, bias=False)  # ID classes 0..max-1
        return model

    def hidden(self, model, batch) -> Tensor:  # (B, L, D) after the final norm
        ids = model.position_ids_for(batch.inputs, batch.position_ids)
        return model.ln_f(model.run_blocks(model.embed(batch.inputs, ids), ids))

    def logits(self, model, batch):  # the token logits of a teacher-forced pass
        return model.read_out(self.hidden(model, batch))

    def loss(self, model, batch):
        if batch.target_ids is None:
            raise ValueError("ppc needs a task that supplies coupled position IDs (e.g. task.options.coupled = true)")
        h = self.hidden(model, batch)
        tokens = F.cross_entropy(model.read_out(h).flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)
        ids = F.cross_entropy(model.id_head(h).flatten(0, 1).float(), batch.target_ids.flatten(), ignore_index=IGNORE)
        return tokens + self.id_loss_weight * ids

    @torch.no_grad()
    def metrics(self, model, batch):
        """id_accuracy: the share of a sample's answer positions whose next ID the ID head
        predicts right, given the true tokens and IDs before it (teacher-forced)."""
        scored = batch.target_ids != IGNORE
        hit = (model.id_head(self.hidden(model, batch)).argmax(-1) == batch.target_ids) & scored
        return {"id_accuracy": hit.sum(1).float() / scored.sum(1).clamp(min=1)}

    @torch.no_grad()
    def predict(self, model, batch):
        from lengthgen.model.generate import generate_answers
        return generate_answers(model, batch, next_id=predicted_id)


def predicted_id(model, hidden: Tensor, last_id: Tensor) -> Tensor:
    """PPC's ID for the next token: the argmax of the ID head on the last hidden state."""
    return model.id_head(model.ln_f(hidden)).argmax(-1)

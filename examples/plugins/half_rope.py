"""A positional scheme as a plugin, in one file: RoPE on half of each head's dimensions, the other
half left without positions (GPT-NeoX's partial rotary, `rotary_pct = 0.5`). Half the channels
can match content wherever it is; the other half carries relative position.

    lengthgen train looped/cpu/parity --plugin examples/plugins/half_rope.py --set model.position=half_rope
    lengthgen reproduce matrix --plugin examples/plugins/half_rope.py --axis model.position=half_rope,rope \\
        --tasks parity,sparse_parity --seeds 1

The run folder records the plugin, so `lengthgen eval`, `--resume`, `report` and `export` of the
run import it again; its options (`theta`, `fraction`) are checked as a built-in scheme's are.
"""
import torch

from lengthgen import PositionalScheme, register


@register.scheme("half_rope")
class HalfRoPE(PositionalScheme):
    """RoPE (Su et al.) on the first `fraction` of each head's dimensions, pairs (i, i + r/2) in
    the GPT-NeoX layout, r the rotated width; the rest untouched."""

    @classmethod
    def check(cls, model) -> None:
        super().check(model)
        if (model.d_model // model.n_head) % 4:
            raise ValueError("model.position half_rope needs a head width (d_model / n_head) divisible by 4")

    def __init__(self, cfg, theta: float = 10000.0, fraction: float = 0.5):
        super().__init__(cfg)
        if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ValueError(f"half_rope fraction must be in (0, 1], got {fraction!r}")
        self.rotated = 2 * max(1, round(self.head_dim * fraction / 2))  # an even number of dimensions
        exponents = torch.arange(0, self.rotated, 2).float() / self.rotated
        self.register_buffer("inv_freq", float(theta) ** -exponents, persistent=False)  # (r/2,)

    def rotate(self, q, k, position_ids):
        angles = position_ids.float()[..., None] * self.inv_freq  # (B|1, T, r/2)
        cos, sin = angles.cos()[:, None].to(q.dtype), angles.sin()[:, None].to(q.dtype)  # (B|1, 1, T, r/2)

        def turn(x):
            x1, x2 = x[..., :self.rotated].chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., self.rotated:]), dim=-1)

        return turn(q), turn(k)

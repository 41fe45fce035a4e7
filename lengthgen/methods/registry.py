"""The `METHODS` registry: every built-in method by name, and `get_method`.

A method is a named recipe over a model, a loss and a prediction rule: it builds its model, computes
the training loss of a Batch and predicts the answer tokens at the scored positions. Every method is
compared on the same metric: exact match of the whole answer (its tokens, and the EOS of tasks whose
answer length varies). The `Method` base and its capabilities are lengthgen.methods.base; each family
has a module of its own:

    next_token.py     ntp, ntp-loop, ntp-pause: next-token prediction and its baselines of the looped paper
    looped/methods.py looped, looped-wo-injection, looped-halt, looped-halt-probe, looped-uncertain,
                      looped-clock: the looped block and its trained stops
    ppc.py            ppc: Predictive Position Coupling
    encoder.py        encoder: whole-answer prediction in one pass (Delétang et al.'s Transformer)
    recurrent.py      rnn, lstm, stack-rnn, tape-rnn: Delétang et al.'s recurrent baselines
"""
from __future__ import annotations

from lengthgen import register
from lengthgen.config.schema import Config
from lengthgen.methods.base import Method
from lengthgen.methods.encoder import Encoder
from lengthgen.methods.looped.methods import (Looped, LoopedClock, LoopedHalt, LoopedHaltProbe, LoopedNoInjection,
                                              LoopedUncertain)
from lengthgen.methods.next_token import NextTokenPrediction, NTPLoop, NTPPause
from lengthgen.methods.ppc import PredictivePositionCoupling
from lengthgen.methods.recurrent import LSTMMethod, RNNMethod, StackRNNMethod, TapeRNNMethod

# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them
METHODS = register.METHODS
METHODS.base = Method
for _cls in (NextTokenPrediction, Looped, LoopedNoInjection, LoopedHalt, LoopedHaltProbe, LoopedUncertain, LoopedClock,
             NTPLoop, NTPPause, PredictivePositionCoupling, Encoder,
             RNNMethod, LSTMMethod, StackRNNMethod, TapeRNNMethod):  # the last four: Delétang et al.'s baselines
    METHODS.add(_cls.name, _cls)


def get_method(name: str, cfg: Config | None = None) -> Method:
    """The method `name`, holding its settings from `cfg` and its options from cfg.method_options
    (its defaults without one)."""
    return METHODS[name](cfg, **(cfg.method_options if cfg is not None else {}))

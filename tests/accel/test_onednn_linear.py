"""The blocks' linear layers on oneDNN (lengthgen/accel/onednn_linear.py): the same outputs and
gradients as F.linear, for the layer and for every method family's loss, taken only where it applies."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lengthgen.accel import onednn_linear
from lengthgen.assembly.runs import new_run
from lengthgen.methods.registry import METHODS
from lengthgen.model import linear as model_linear
from lengthgen.tasks.base import sample_mixed

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not onednn_linear.available(), reason="torch built without oneDNN")]


@pytest.fixture
def forced(monkeypatch):
    """The kernel on for every fp32 CPU matmul, whatever this machine's rule and the matmul's size."""
    monkeypatch.setattr(onednn_linear, "enabled", True)
    monkeypatch.setattr(onednn_linear, "MIN_MACS", 0)


def float64_reference(x, w, b, grad):
    x, w = x.double().requires_grad_(), w.double().requires_grad_()
    b = None if b is None else b.double().requires_grad_()
    y = F.linear(x, w, b)
    return y, torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], grad.double())


@pytest.mark.parametrize("shape,n_out,bias", [((1664, 64), 256, True), ((7, 33, 256), 64, True),
                                              ((3, 5, 64), 192, False), ((1, 1, 8), 3, True)])
def test_output_and_gradients_equal_f_linear(forced, shape, n_out, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).requires_grad_()
    w = torch.randn(n_out, shape[-1], generator=g).requires_grad_()
    b = torch.randn(n_out, generator=g).requires_grad_() if bias else None
    y = onednn_linear.kernel(x, w, b)
    assert y is not None and y.shape == (*shape[:-1], n_out)
    grad = torch.randn(y.shape, generator=g)
    got = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], grad)
    want_y, want = float64_reference(x, w, b, grad)
    scale = shape[-1] ** 0.5  # a sum of shape[-1] products of unit normals
    assert torch.allclose(y.double(), want_y, atol=1e-5 * scale)
    assert not torch.allclose(y.double(), F.linear(x.double(), w.double().flip(0)), atol=1e-3)  # rows kept in order
    for a, c in zip(got, want):
        assert a.shape == c.shape
        assert torch.allclose(a.double(), c, rtol=1e-5, atol=1e-5 * c.abs().max().item()), (a.double() - c).abs().max()


def test_gradients_only_for_what_needs_them(forced):
    x, w = torch.randn(40, 16), torch.randn(8, 16).requires_grad_()
    y = onednn_linear.kernel(x, w, None)
    (dw,) = torch.autograd.grad(y.sum(), [w])
    assert torch.allclose(dw, x.sum(0).expand(8, 16), atol=1e-5)


def test_taken_only_for_large_fp32_cpu_matmuls_outside_autocast_compile_and_vmap(monkeypatch):
    monkeypatch.setattr(onednn_linear, "enabled", True)
    w = torch.zeros(256, 64)
    big = torch.zeros(16, 104, 64)  # 1664 rows x 64 x 256: 27M multiply-adds
    assert onednn_linear.applies(big, w)
    assert not onednn_linear.applies(torch.zeros(512, 64), w)  # 8M: oneDNN's per-call cost loses in a step
    assert not onednn_linear.applies(big, torch.zeros(3, 64))  # a read-out to 3 symbols: 0.3M
    assert not onednn_linear.applies(big.bfloat16(), w.bfloat16())
    assert not onednn_linear.applies(big, w.t().contiguous().t())  # a non-contiguous weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_linear.applies(big, w)
    seen = []
    torch.func.vmap(lambda row: seen.append(onednn_linear.applies(row, w)) or row)(torch.zeros(2, 1664, 64))
    assert seen == [False]  # vmap over stacked seeds: a C op cannot see a batched tensor's rows
    torch.set_num_threads(2)
    try:
        assert not onednn_linear.applies(big, w)  # 27M: enough on one thread, not on two
        assert onednn_linear.applies(torch.zeros(4096, 64), w)  # 64M
    finally:
        torch.set_num_threads(1)
    monkeypatch.setattr(onednn_linear, "enabled", False)
    assert not onednn_linear.applies(big, w)
    assert model_linear.linear(big, w).shape == (16, 104, 256)


def test_the_machine_rule_and_the_switch(monkeypatch):
    monkeypatch.setattr(onednn_linear, "cpu_info", lambda: ("AuthenticAMD", {"avx2", "avx512f"}))
    assert onednn_linear.decide(None) and onednn_linear.decide("auto") and not onednn_linear.decide("0")
    monkeypatch.setattr(onednn_linear, "cpu_info", lambda: ("GenuineIntel", {"avx2", "avx512f"}))
    assert not onednn_linear.decide(None)  # MKL runs AVX-512 on Intel's CPUs itself
    assert onednn_linear.decide("1")
    monkeypatch.setattr(onednn_linear, "cpu_info", lambda: ("AuthenticAMD", {"avx2"}))
    assert not onednn_linear.decide(None)  # no AVX-512 for oneDNN to add
    monkeypatch.setattr(onednn_linear, "cpu_info", lambda: ("", set()))
    assert not onednn_linear.decide(None)


def test_cpu_info_reads_this_machines_vendor_and_flags():
    vendor, flags = onednn_linear.cpu_info()
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert vendor and vendor in text and flags and all(f in text for f in flags)


FAMILY = {"ppc": ["task.name=decimal_addition", "task.options.coupled=true", "model.position=learned"],
          "stack-rnn": ["task.name=reverse_string"]}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_family_trains_on_the_same_loss_and_gradients(monkeypatch, name):
    """Every linear layer of the model on oneDNN (forced, however small) against F.linear."""
    run = new_run(None, [f"method={name}", *FAMILY.get(name, ["task.name=addition"]), "model.d_model=32",
                         "model.n_head=2", "model.n_layer=2", "model.bias=true", "task.train_max=6",
                         "train.device=cpu"])
    torch.manual_seed(0)
    model = run.method.build_model(run.cfg, run.task)
    with torch.no_grad():  # biases start at 0: moved, so that a kernel that dropped one would show
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = sample_mixed(run.task, 9, 1, 6, torch.Generator().manual_seed(3))
    calls = []
    results = []
    for on in (True, False):
        monkeypatch.setattr(onednn_linear, "enabled", on)
        monkeypatch.setattr(onednn_linear, "MIN_MACS", 0)
        monkeypatch.setattr(onednn_linear.OneDnnLinear, "apply", counted(onednn_linear.OneDnnLinear.apply, calls))
        model.zero_grad(set_to_none=True)
        loss = run.method.loss(model, batch)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    if not any(isinstance(m, model_linear.Linear) for m in model.modules()):
        assert not calls  # a recurrent model: no blocks, nothing to take
        return
    assert calls, "the kernel took no call"
    (a, grads_a), (b, grads_b) = results
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a, b)
    assert len(grads_a) == len(grads_b) > 0
    for x, y in zip(grads_a, grads_b):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), (x - y).abs().max()


def counted(apply, calls):
    def wrapper(*args):
        calls.append(1)
        return apply(*args)
    return wrapper


def test_the_kept_transpose_follows_every_update_of_the_weight(forced):
    """dx = dy W reads weight^T made once per version: after an in-place update it must be the new W."""
    x, w = torch.randn(30, 16).requires_grad_(), torch.nn.Parameter(torch.randn(8, 16))
    grad = torch.randn(30, 8)
    for update in range(3):
        for _ in range(2):  # a looped block: the same weight applied again, the kept transpose reused
            (dx,) = torch.autograd.grad(onednn_linear.kernel(x, w, None), [x], grad)
            assert torch.allclose(dx, grad @ w.detach(), atol=1e-5)
        with torch.no_grad():
            w.mul_(-2.0)  # as an optimizer step updates it
    moved = torch.nn.Parameter(torch.randn(8, 16))
    torch.autograd.grad(onednn_linear.kernel(x, moved, None), [x], grad)  # its transpose kept at version 0
    moved.data = torch.randn(8, 16)  # new storage, also at version 0 (a checkpoint loaded by assignment)
    (dx,) = torch.autograd.grad(onednn_linear.kernel(x, moved, None), [x], grad)
    assert torch.allclose(dx, grad @ moved.detach(), atol=1e-5)

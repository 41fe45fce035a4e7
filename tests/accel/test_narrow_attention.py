"""The narrow-head attention kernel (lengthgen/accel/narrow_attention.py): the same attention and
gradients as SDPA, taken only where it applies, and SDPA when it cannot be built."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.accel import narrow_attention
from lengthgen.model.attention import CausalSelfAttention
from lengthgen.model.positions import build_scheme

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kernel():
    if narrow_attention.library() is None:
        pytest.skip("no C compiler on this machine: the kernel is not built (its fallback is tested below)")


def qkv_views(B, H, T, D, dtype=torch.float64, seed=0):
    """q, k, v (B, H, T, D) as the model makes them: views of one fused (B, T, 3 H D) projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 3 * H * D, generator=g, dtype=dtype)
    return [t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, 2)]


@pytest.mark.parametrize("B,H,T,D", [(3, 16, 14, 4), (2, 5, 9, 3), (4, 8, 30, 8), (2, 64, 22, 4), (1, 2, 1, 4)])
def test_attention_and_its_gradients_equal_sdpa_in_float64(kernel, B, H, T, D):
    q, k, v = (t.requires_grad_() for t in qkv_views(B, H, T, D))
    want = F.scaled_dot_product_attention(q * 1.7, k, v, is_causal=True)  # q scaled, as T5's q_factor does
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    k_other_layout = k32.transpose(1, 2).contiguous().transpose(1, 2)  # a rotated key's layout
    got = narrow_attention.attend(q32 * 1.7, k_other_layout, v32)
    got_grads = torch.autograd.grad(got, (q32, k32, v32), grad.float())
    assert torch.allclose(got.double(), want, atol=2e-6)
    if T > 1:  # the scale of q reached the kernel (one token attends to itself whatever the scale)
        assert not torch.allclose(got.double(), F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-3)
    for a, b in zip(got_grads, want_grads):
        assert torch.allclose(a.double(), b, atol=1e-5), (a.double() - b).abs().max()


def test_sharp_attention_equals_sdpa_where_the_kernels_exp_clamps_far_below_the_max(kernel):
    # scores 100s apart: exp of a difference below -87 is clamped to e^-87 (1.6e-38) in the
    # kernel's vector exp; the softmax must still equal SDPA's, forward and backward
    q, k, v = (t.requires_grad_() for t in qkv_views(2, 16, 20, 4, seed=3))
    want = F.scaled_dot_product_attention(q * 60, k, v, is_causal=True)
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = narrow_attention.attend(q32 * 60, k32, v32)
    got_grads = torch.autograd.grad(got, (q32, k32, v32), grad.float())
    assert torch.allclose(got.double(), want, atol=1e-5)
    for a, b in zip(got_grads, want_grads):
        assert torch.allclose(a.double(), b, atol=2e-4, rtol=1e-4), (a.double() - b).abs().max()


def test_a_query_never_sees_a_later_key(kernel):
    q, k, v = qkv_views(2, 16, 10, 4, torch.float32)
    before = narrow_attention.attend(q, k, v)
    v2 = v.clone()
    v2[:, :, 6:] += 100.0  # change only keys 6.. : outputs 0..5 must not move
    after = narrow_attention.attend(q, k, v2)
    assert torch.equal(before[:, :, :6], after[:, :, :6])
    assert not torch.allclose(before[:, :, 6:], after[:, :, 6:])


def test_taken_only_for_narrow_fp32_attention_without_dropout(kernel):
    q = torch.zeros(2, 16, 5, 4)
    assert narrow_attention.applies(q)
    assert not narrow_attention.applies(torch.zeros(2, 4, 5, 16))  # wide heads: SDPA is faster there
    assert not narrow_attention.applies(q.bfloat16())
    assert not narrow_attention.applies(q, dropout_p=0.1)
    assert not narrow_attention.applies(torch.zeros(2, 16, 0, 4))
    torch.set_num_threads(2)
    try:
        assert narrow_attention.applies(q)  # the batch is split over the threads
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_split_over_threads_the_batch_gives_the_one_thread_result(kernel, threads):
    B, H, T, D = 5, 16, 11, 4  # 5 rows over 2, 3 or (more threads than rows) 8 slices
    q, k, v = (t.requires_grad_() for t in qkv_views(B, H, T, D, torch.float32, seed=4))
    grad = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(5))
    one = narrow_attention.attend(q, k, v)
    one_grads = torch.autograd.grad(one, (q, k, v), grad)
    torch.set_num_threads(threads)
    try:
        slices = narrow_attention.threads(B)
        many = narrow_attention.attend(q, k, v)
        many_grads = torch.autograd.grad(many, (q, k, v), grad)
    finally:
        torch.set_num_threads(1)
    assert slices == (min(threads, B) if narrow_attention.library().threaded else 1)
    assert torch.equal(one, many)  # each row's arithmetic is the same whichever slice holds it
    for a, b in zip(one_grads, many_grads):
        assert torch.equal(a, b)
    assert torch.allclose(many, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)


@pytest.mark.skipif(not torch.__config__.parallel_info().count("OpenMP"), reason="torch without OpenMP")
def test_the_kernel_splits_on_torchs_own_openmp_runtime(kernel):
    """Built with -fopenmp, the kernel links the libgomp torch loaded, not a second runtime whose
    threads would contend with torch's for the cores."""
    runtimes = narrow_attention.openmp_runtimes()
    if not runtimes:
        pytest.skip("no /proc/self/maps to read the runtimes from")
    assert len(runtimes) == 1 and narrow_attention.library().threaded
    built = narrow_attention.build(narrow_attention.cache_folder()).read_bytes()
    assert b"GOMP_parallel" in built or b"__kmpc_fork_call" in built  # it calls OpenMP (gcc's or clang's)


def test_an_attention_layer_gives_the_same_output_and_gradients_either_way(kernel, monkeypatch):
    cfg = ModelConfig(d_model=64, n_layer=1, n_head=16, position="nope")
    torch.manual_seed(0)
    layer, scheme = CausalSelfAttention(cfg, 0), build_scheme(cfg)
    x = torch.randn(3, 12, 64)
    ids = torch.arange(12).expand(3, 12)
    results = []
    for on in (True, False):
        monkeypatch.setattr(narrow_attention, "enabled", on)
        layer.zero_grad()
        y = layer(x, scheme, ids)
        y.square().sum().backward()
        results.append((y.detach(), layer.c_attn.weight.grad.clone()))
    (y_kernel, g_kernel), (y_sdpa, g_sdpa) = results
    assert torch.allclose(y_kernel, y_sdpa, atol=1e-5)
    assert torch.allclose(g_kernel, g_sdpa, atol=1e-4, rtol=1e-4)


def test_without_a_compiler_attention_stays_with_sdpa_and_says_so_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    narrow_attention.library.cache_clear()
    try:
        assert not narrow_attention.applies(torch.zeros(2, 16, 5, 4))
        assert not narrow_attention.applies(torch.zeros(2, 16, 5, 4))
        err = capsys.readouterr().err
        assert err.count("narrow-head attention kernel unavailable, using SDPA") == 1
        assert len(err.strip().splitlines()) == 1
    finally:
        narrow_attention.library.cache_clear()


def test_a_damaged_library_in_the_cache_is_built_again(kernel, tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    # built twice: without optimisation, 0.2 s a build against 8 s at -O3 (caching and rebuilding
    # do not depend on the flags; the results below are the kernel's either way)
    monkeypatch.setattr(narrow_attention, "COMPILE_FLAGS", ["-O0", "-fPIC", "-std=c11"])
    built = narrow_attention.build(tmp_path)
    assert narrow_attention.build(tmp_path) == built  # cached: the same file, not rebuilt
    built.write_bytes(b"not a shared library")
    narrow_attention.library.cache_clear()
    try:
        assert narrow_attention.library() is not None
        q, k, v = qkv_views(1, 16, 4, 4, torch.float32)
        assert torch.allclose(narrow_attention.attend(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                              atol=1e-6)
    finally:
        narrow_attention.library.cache_clear()

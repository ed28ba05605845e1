"""tflgpu.cpu.gemm: numpy's BLAS called from numba's threads, against numpy's own product."""

from __future__ import annotations

import numpy as np
import pytest

from tflgpu.cpu import gemm
from tflgpu.cpu.conv import conv_product, im2col_matmul
from tflgpu.ops.jit import set_num_threads


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    set_num_threads(request.param)
    yield request.param
    set_num_threads(2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", [(1, 300, 1001), (3, 64, 257), (5, 7, 3), (130, 33, 96), (4097, 16, 24)])
def test_gemm_bias_clamp_is_numpys_product(m, k, n, dtype, threads):
    rng = np.random.default_rng(m * k + n)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    got = gemm.gemm_bias_clamp(a, b, bias, -1.5, 2.0)
    want = np.clip(a @ b + bias, -1.5, 2.0)
    assert got.dtype == dtype and got.shape == (m, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 if dtype == np.float32 else 1e-12)


def test_gemm_clamp_passes_nan_as_tflite(threads):
    """std::min(std::max(v, lo), hi) keeps a NaN: so must the fused clamp (np.clip does too)."""
    a = np.ones((300, 40), np.float32)
    a[7, 3] = np.nan
    got = gemm.gemm_bias_clamp(a, np.ones((40, 50), np.float32), np.zeros(50, np.float32), 0.0, 6.0)
    assert np.isnan(got[7]).all() and not np.isnan(np.delete(got, 7, axis=0)).any()
    assert (got[:7] == 6.0).all()


@pytest.mark.parametrize("geometry", [
    (3, 3, 1, 1, 1, 1, "SAME"), (3, 3, 2, 2, 1, 1, "SAME"), (5, 3, 1, 2, 2, 1, "VALID"), (1, 1, 2, 2, 1, 1, "VALID"),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_product_is_im2col_times_weights(geometry, dtype, threads):
    from tflgpu.ops.attributes import conv_padding

    kh, kw, sh, sw, dh, dw, pad = geometry
    rng = np.random.default_rng(kh * 10 + sh)
    x = rng.standard_normal((2, 23, 19, 6)).astype(dtype)
    wm = rng.standard_normal((kh * kw * 6, 17)).astype(dtype)
    bias = rng.standard_normal(17).astype(dtype)
    code = 0 if pad == "SAME" else 1
    oh, pt = conv_padding(23, kh, sh, dh, code)
    ow, pl = conv_padding(19, kw, sw, dw, code)
    got = conv_product(x, wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, bias, -0.5, 0.5)
    want = np.clip(im2col_matmul(x, wm, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow) + bias, -0.5, 0.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 if dtype == np.float32 else 1e-12)


def test_without_a_usable_blas_products_go_through_numpy(monkeypatch):
    """No cblas_sgemm found (another BLAS, or one giving other numbers): the same results, from numpy."""
    monkeypatch.setattr(gemm, "_FOUND", [None])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((500, 64)).astype(np.float32), rng.standard_normal((64, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    np.testing.assert_allclose(gemm.gemm_bias_clamp(a, b, bias, 0.0, np.inf), np.maximum(a @ b + bias, 0),
                               rtol=1e-6, atol=1e-6)
    x = rng.standard_normal((1, 20, 20, 4)).astype(np.float32)
    assert gemm.conv_bias_clamp(x, b[:36], bias, 0.0, 1.0, 3, 3, 1, 1, 1, 1, 1, 1, 20, 20) is None
    y = conv_product(x, b[:36].copy(), 3, 3, 1, 1, 1, 1, 1, 1, 20, 20, bias, 0.0, 1.0)
    np.testing.assert_allclose(y, np.clip(im2col_matmul(x, b[:36].copy(), 3, 3, 1, 1, 1, 1, 1, 1, 20, 20) + bias,
                                          0, 1), rtol=1e-6, atol=1e-6)


def test_a_blas_giving_other_numbers_is_not_used(monkeypatch, caplog):
    """The found sgemm is checked on a small ragged product; one that disagrees is logged and not used."""
    if gemm.find_blas() is None:
        pytest.skip("numpy's BLAS has no cblas_sgemm here")
    assert gemm._agrees(gemm.find_blas(), np.float32) and gemm._agrees(gemm.find_blas(), np.float64)
    monkeypatch.setattr(gemm, "_agrees", lambda blas, dtype: False)
    with caplog.at_level("WARNING", logger="tflgpu"):
        assert gemm._find() is None
    assert "gives numbers unlike numpy's" in caplog.text


@pytest.mark.parametrize("geometry", [(3, 3, 2, 2, "SAME"), (1, 1, 1, 1, "VALID"), (5, 3, 1, 2, "SAME")])
@pytest.mark.parametrize("xdtype,odtype,wdtype", [(np.int8, np.int8, np.float32), (np.uint8, np.uint8, np.float32),
                                                  (np.int16, np.int16, np.float64)])
def test_conv_requantize_is_the_product_then_the_requantization(geometry, xdtype, odtype, wdtype, threads):
    """The fused integer convolution (input offset while im2col is built, requantized per block) gives exactly
    what the product of the offset input and XNNPACK's fp32 requantization of the sums give, padding included."""
    from tflgpu.cpu.quantized import requantize_fp32
    from tflgpu.ops.attributes import conv_padding

    kh, kw, sh, sw, pad = geometry
    rng = np.random.default_rng(kh * 7 + sh)
    info = np.iinfo(xdtype)
    x = rng.integers(info.min, info.max, (2, 21, 17, 5), endpoint=True).astype(xdtype)
    xz = int(rng.integers(info.min // 2, info.max // 2)) if xdtype != np.int16 else 0
    wm = rng.integers(-127, 127, (kh * kw * 5, 19), endpoint=True).astype(wdtype)
    bias = rng.integers(-5000, 5000, 19).astype(np.float64)
    scale = rng.uniform(1e-4, 2e-2, 19).astype(np.float32) / (256 if xdtype == np.int16 else 1)
    oinfo = np.iinfo(odtype)
    oz, lo, hi = (3 if odtype != np.int16 else 0), oinfo.min + 5, oinfo.max
    code = 0 if pad == "SAME" else 1
    oh, pt = conv_padding(21, kh, sh, 1, code)
    ow, pl = conv_padding(17, kw, sw, 1, code)
    got = gemm.conv_requantize(x, xz, wm, bias, scale, oz, lo, hi, odtype, kh, kw, sh, sw, 1, 1, pt, pl, oh, ow)
    acc = conv_product(x.astype(wdtype) - wdtype(xz), wm, kh, kw, sh, sw, 1, 1, pt, pl, oh, ow)
    want = requantize_fp32(acc, bias, scale, oz, lo, hi, odtype)
    assert got.dtype == odtype and got.shape == want.shape
    assert np.unique(got).size > 20  # (not all clamped)
    np.testing.assert_array_equal(got, want)


def test_an_invoke_runs_blas_on_one_thread_and_puts_the_users_setting_back():
    from threadpoolctl import threadpool_info, threadpool_limits

    from tflgpu.cpu.threads import cpu_threads

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    if not blas_threads():
        pytest.skip("numpy has no BLAS threadpoolctl can see")
    with threadpool_limits(2, user_api="blas"):
        with cpu_threads(2):
            assert blas_threads() == [1] * len(blas_threads())
        assert blas_threads() == [2] * len(blas_threads())

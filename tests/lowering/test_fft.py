"""torch.fft, stft and conjugation match CPU eager on both paths, with no CPU fallback.

Every torch.fft function reaches aten's three primitives (_fft_r2c, _fft_c2c, _fft_c2r) with a
normalization mode and, for the real transforms, a one-sided last dim; the inverse Hermitian
transforms (ihfft*) also conjugate, which lazy tensors do physically.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import assert_same
from tests.lowering._core import core_no_fallback, dev  # noqa: F401 (autouse fixture)

TOL = dict(rtol=1e-5, atol=1e-4)
NORMS = (None, "forward", "ortho", "backward")


def _real(*shape):
    torch.manual_seed(0)
    return torch.randn(*shape)


def _complex(*shape):
    torch.manual_seed(1)
    return torch.randn(*shape, dtype=torch.complex64)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [torch.fft.fft, torch.fft.ifft, torch.fft.rfft, torch.fft.ihfft])
def test_one_dimensional_real_input_transforms_scale_like_eager(path, fn, norm):
    x = _real(3, 10)
    assert_same(fn(dev(x), norm=norm), fn(x, norm=norm), **TOL)
    assert_same(fn(dev(x), n=7, dim=0, norm=norm), fn(x, n=7, dim=0, norm=norm), **TOL)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [torch.fft.fft, torch.fft.ifft, torch.fft.hfft, torch.fft.irfft])
def test_one_dimensional_complex_input_transforms_scale_like_eager(path, fn, norm):
    x = _complex(4, 6)
    assert_same(fn(dev(x), norm=norm), fn(x, norm=norm), **TOL)
    assert_same(fn(dev(x), n=9, dim=0, norm=norm), fn(x, n=9, dim=0, norm=norm), **TOL)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [torch.fft.fftn, torch.fft.ifftn, torch.fft.rfftn, torch.fft.ihfftn,
                                torch.fft.fft2, torch.fft.rfft2, torch.fft.ihfft2])
def test_multi_dimensional_real_input_transforms_over_any_dims(path, fn, norm):
    x = _real(3, 4, 5)
    assert_same(fn(dev(x), norm=norm), fn(x, norm=norm), **TOL)
    # the one-sided dim is the LAST one listed, whatever the order
    assert_same(fn(dev(x), dim=(2, 0), norm=norm), fn(x, dim=(2, 0), norm=norm), **TOL)
    assert_same(fn(dev(x), s=(6, 3), dim=(0, 1), norm=norm),
                fn(x, s=(6, 3), dim=(0, 1), norm=norm), **TOL)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("fn", [torch.fft.fftn, torch.fft.ifftn, torch.fft.irfftn, torch.fft.hfftn,
                                torch.fft.ifft2, torch.fft.irfft2, torch.fft.hfft2])
def test_multi_dimensional_complex_input_transforms_over_any_dims(path, fn, norm):
    x = _complex(3, 4, 5)
    assert_same(fn(dev(x), norm=norm), fn(x, norm=norm), **TOL)
    assert_same(fn(dev(x), dim=(2, 0), norm=norm), fn(x, dim=(2, 0), norm=norm), **TOL)
    assert_same(fn(dev(x), s=(5, 6), dim=(0, 2), norm=norm),
                fn(x, s=(5, 6), dim=(0, 2), norm=norm), **TOL)


def test_four_dims_at_once_exceed_xla_three_dim_fft_and_still_match(path):
    x = _real(2, 3, 4, 5)
    assert_same(torch.fft.fftn(dev(x)), torch.fft.fftn(x), **TOL)
    assert_same(torch.fft.rfftn(dev(x)), torch.fft.rfftn(x), **TOL)
    y = torch.fft.rfftn(x)
    assert_same(torch.fft.irfftn(dev(y), s=x.shape), torch.fft.irfftn(y, s=x.shape), **TOL)


def test_irfft_ignores_the_imaginary_parts_a_real_signal_cannot_have(path):
    x = _complex(5)          # DC and Nyquist entries carry imaginary parts
    assert_same(torch.fft.irfft(dev(x)), torch.fft.irfft(x), **TOL)
    assert_same(torch.fft.irfft(dev(x), n=9), torch.fft.irfft(x, n=9), **TOL)


def test_round_trip_returns_the_signal(path):
    x = _real(4, 8)
    d = torch.fft.irfft(torch.fft.rfft(dev(x)), n=8)
    assert_same(d, x, **TOL)
    z = torch.fft.ifft2(torch.fft.fft2(dev(x)))
    assert_same(z, x.to(torch.complex64), **TOL)


@pytest.mark.parametrize("center,onesided,normalized", [(True, None, False), (False, False, True)])
def test_stft_and_istft_match_eager(path, center, onesided, normalized):
    x = _real(2, 64)
    w = torch.hann_window(16)
    kw = dict(n_fft=16, hop_length=4, window=w, center=center, onesided=onesided,
              normalized=normalized, return_complex=True)
    expected = torch.stft(x, **kw)
    actual = torch.stft(dev(x), **{**kw, "window": dev(w)})
    assert_same(actual, expected, **TOL)
    ikw = dict(n_fft=16, hop_length=4, window=w, center=center, onesided=onesided,
               normalized=normalized)
    if center:   # istft needs the window envelope to be non-zero everywhere (centred frames)
        assert_same(torch.istft(actual, **{**ikw, "window": dev(w)}),
                    torch.istft(expected, **ikw), **TOL)


def test_conj_is_physical_on_device_and_resolve_is_a_copy(path):
    z = _complex(3, 4)
    d = dev(z)
    assert_same(d.conj(), z.conj().resolve_conj())
    assert_same(torch.conj_physical(d), torch.conj_physical(z))
    assert_same(d.conj().resolve_conj() * 2, z.conj() * 2)
    assert_same(d.conj().imag, z.conj().imag)
    w = dev(z)
    w.conj_physical_()
    assert_same(w, z.conj_physical())
    r = _real(3)
    assert_same(dev(r).conj(), r)

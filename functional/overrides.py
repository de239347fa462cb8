"""Kernels this path registers in front of PyTorch's own, at one dispatch key of an aten op."""
from __future__ import annotations

import warnings

import torch


def override(lib: torch.library.Library, op, kernel, key: str, *, with_keyset=False) -> None:
    """``lib.impl(op, kernel, key)``, without torch's warning that a kernel was already
    registered there: replacing it is the point (the replaced one, fetched first with
    ``torch.library.get_kernel``, is what the new kernel falls back on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lib.impl(op, kernel, key, with_keyset=with_keyset)


def installs_once(register):
    """Decorator: ``install()`` that calls ``register(lib)`` the first time only, with a new
    ``torch.library.Library("aten", "IMPL")`` that the module keeps (its kernels stay registered
    as long as the library lives)."""
    libs: list = []

    def install() -> None:
        if not libs:
            libs.append(torch.library.Library("aten", "IMPL"))
            register(libs[0])
    install.__doc__ = register.__doc__
    return install

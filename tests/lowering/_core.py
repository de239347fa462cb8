"""What the lowering-family tests share: run on the core path with CPU fallback forbidden."""
from __future__ import annotations

import pytest

import xla_compat as xc
from xla_compat import paths, settings


@pytest.fixture(autouse=True)
def core_no_fallback():
    """Importing this into a test module makes every test there run bare (core path) and fail
    on any CPU fallback: a rule, not the CPU, must compute the result."""
    with paths.activated("core"), settings.override(cpu_fallback="error"):
        yield


def dev(t):
    return t.to(xc.device())

"""Registers PyTorch's PrivateUse1 key as the ``hlo`` device, once, at import."""
from __future__ import annotations

import types

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

NAME = "hlo"


class _BackendModule(types.ModuleType):
    """``torch.hlo``: what torch expects of a backend module (seeding, availability)."""

    def is_available(self):
        return True

    def device_count(self):
        return 1

    def current_device(self):
        return 0

    def _is_in_bad_fork(self):
        return False

    def manual_seed_all(self, seed):
        from .lazy import rng
        rng.manual_seed(seed)

    manual_seed = manual_seed_all

    def get_rng_state(self, device=None):
        from .lazy import rng
        return rng.get_state()

    def set_rng_state(self, new_state, device=None):
        from .lazy import rng
        rng.set_state(new_state)

    def is_initialized(self):
        return True

    def get_amp_supported_dtype(self):
        return [torch.bfloat16, torch.float16]

    def _lazy_init(self):
        pass

    def device(self, device):
        """Reached by ``storage.to(hlo)`` (torch's storage copy): hlo tensors have no storage, and
        past this point torch would allocate one on PrivateUse1 and crash the process. (torch's
        checkpoint also enters this, but only once the module has ``_initialized`` set.)"""
        raise RuntimeError(
            f"xla_compat: a storage cannot be moved to {device}: hlo tensors are lazy and have no "
            f"storage. Move tensors instead (tensor.to('{NAME}')), or load a checkpoint with "
            f"torch.load(f, map_location='{NAME}').")


if torch._C._get_privateuse1_backend_name() != NAME:
    _setup_privateuseone_for_python_backend(NAME, backend_module=_BackendModule(f"torch.{NAME}"))

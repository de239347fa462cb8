"""The functional path: PyTorch functionalization over the hlo device (xla_compat.functional).

Every hlo tensor on this path is a FunctionalTensorWrapper around a ``FunctionalInner`` LazyTensor;
PyTorch's Functionalize kernels turn views into ``*_copy`` ops and in-place ops into functional
ops plus ``*_scatter`` write-backs, so the lazy graph underneath has no aliasing at all.
"""
from __future__ import annotations

if __name__ != "xla_compat.functional":
    # The repository root on sys.path makes ``functional`` importable by its folder name: that is a
    # second copy of the path, whose kernels and registries would replace the real ones.
    raise ImportError(f"import xla_compat.functional, not {__name__} (the same code under a second "
                      f"name would register the path twice)")

from xla_compat import dynamo as _dynamo
from xla_compat import executor as _executor
from xla_compat import paths as _paths
from xla_compat.lazy.ir import skip_frames_in

from . import assign as _assign
from . import boundary as _boundary
from .inner import FunctionalInner
from .strides import storage_id
from .wrap import after_sync as _after_sync
from .wrap import roll_back as _roll_back
from .wrap import alias_id, before_sync, inner, owns, probe, to_path, wrap
from .writes import FunctionalizationLimit
from . import writes_eager as _writes_eager
from . import eager_resize as _eager_resize
from . import checks as _checks
from . import direct as _direct
from . import shared_writes as _shared_writes
from . import view_checks as _view_checks

VERSION = "1"

# IR nodes record the user's line, not a line of this package (as legacy/ does).
skip_frames_in(__path__[0])

IMPL = _paths.PathImpl(
    name="functional", version=VERSION, torch_versions=">=2.13,<2.15",
    tensor_cls=FunctionalInner, wrap=wrap, inner=inner, owns=owns, before_sync=before_sync,
    probe=probe, to_path=to_path, assign=_assign.assign, storage_id=storage_id,
    extras={"alias_id": alias_id})

_boundary.install()
_writes_eager.install()
_eager_resize.install()
_checks.install()
_direct.install()
_shared_writes.install()
_view_checks.install()
_dynamo.skip(__name__)       # torch.compile calls the path's code, never traces it
_paths.register(IMPL)
_executor.register_rebinder(_after_sync)
_executor.register_failure_hook(_roll_back)

__all__ = ["FunctionalInner", "FunctionalizationLimit", "IMPL", "alias_id", "inner", "owns",
           "to_path", "wrap"]

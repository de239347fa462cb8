"""The path packages load under one name only: ``legacy`` and ``functional`` are folders at the
repository root, importable by those names whenever the root is on sys.path (tests, scripts);
a second copy would register its kernels over the real path's."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("pkg", ["legacy", "functional"])
def test_a_path_package_refuses_its_folder_name(pkg):
    code = (f"import xla_compat.{pkg}\n"
            f"try:\n    import {pkg}\nexcept ImportError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"refused: import xla_compat.{pkg}, not {pkg}" in out.stdout

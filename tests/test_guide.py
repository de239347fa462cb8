"""Every code block in migration_guide/ runs: python blocks in order, one process per page."""
from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

GUIDE = pathlib.Path(__file__).resolve().parent.parent / "migration_guide"
ROOT = GUIDE.parent
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks(page: pathlib.Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(page.read_text()) if kind == lang]


PAGES = sorted(GUIDE.glob("*.md"))


def _env():
    """The pages' code runs in a user's environment: none of xla_compat's settings (XLA_*) set,
    XLA's own flags (XLA_FLAGS, conftest's) kept."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("XLA_") and k != "XLA_FLAGS":
            env.pop(k)
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p, "python")], ids=lambda p: p.name)
def test_python_blocks_of_a_page_run_in_order(page):
    code = "\n\n".join(_blocks(page, "python"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{page.name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


BASH = [(p, i, line) for p in PAGES for i, body in enumerate(_blocks(p, "bash"))
        for line in body.strip().splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("page,index,line", BASH, ids=[f"{p.name}:{i}" for p, i, _ in BASH])
def test_shell_commands_run(page, index, line):
    argv = shlex.split(line)
    assert argv[0] == "python", f"{page.name}: only python commands belong in the guide: {line}"
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{page.name}: {line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

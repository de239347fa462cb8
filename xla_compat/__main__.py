"""The command line: ``python -m xla_compat doctor | run [--path P] script.py [args]``.

A subcommand is one function registered with ``@command``; ``report`` and ``bench`` are meant to
be added the same way (here, or in a module listed in ``EXTENSIONS``).
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import runpy
import sys
from dataclasses import dataclass
from typing import Callable

EXTENSIONS: tuple[str, ...] = (    # modules that register more subcommands when imported
    "xla_compat.dualrun.cli",
)

# Under ``python -m xla_compat`` this module runs as ``__main__``; extensions import
# ``xla_compat.__main__`` to register, so both names must be this one module (one registry).
sys.modules.setdefault("xla_compat.__main__", sys.modules[__name__])


@dataclass(frozen=True)
class Command:
    """One subcommand: ``configure(parser)`` adds its arguments, ``run(args)`` returns the exit code."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, configure: Callable = lambda parser: None):
    """Register ``fn(args) -> exit code`` as subcommand ``name``."""
    def register(fn):
        COMMANDS[name] = Command(name, help, configure, fn)
        return fn
    return register


# -- doctor -------------------------------------------------------------------------------------

def _tiny_program(dev):
    """A few views written through, a matmul and a reduction: where the two paths differ most."""
    import torch
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    w = torch.linspace(-1.0, 1.0, 8).reshape(4, 2).to(dev)
    x.t().mul_(2)                  # write through a transposed view
    x[1].add_(1)                   # write through a selected row
    x[:, 1:3].sub_(0.5)            # write through a slice
    out = torch.relu(x @ w - 1).sum(0)
    return x, out


def _check_path(name: str) -> tuple[bool, str]:
    import torch
    import xla_compat as xc
    expected = _tiny_program("cpu")
    try:
        with xc.use_path(name):
            got = _tiny_program(xc.device())
            xc.sync()
            got = [t.cpu() for t in got]
    except Exception as e:  # doctor reports, it does not crash
        return False, f"FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    diff = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    ok = all(torch.allclose(g, e) for g, e in zip(got, expected))
    return ok, f"{'OK' if ok else 'MISMATCH'} (max abs difference from CPU eager {diff:g})"


@command("doctor", "versions, the path decision and its reason, and a check of each path")
def doctor(args) -> int:
    import jax
    import torch
    import xla_compat as xc
    from xla_compat import dispatch, paths

    xc.device()
    d = xc.explain()
    print("xla_compat doctor")
    print(f"versions: xla_compat {xc.__version__}, torch {torch.__version__}, jax "
          f"{jax.__version__}, python {platform.python_version()}")
    print("decision:")
    print("\n".join("  " + line for line in str(d).splitlines()))
    print("paths this torch supports:")
    support = dispatch.supported()
    for name in paths.names():
        impl = paths.get(name)
        why = support.get(name)
        state = "supported" if why is None else f"not supported: {why}"
        print(f"  {name:<12} version {impl.version:<8} torch{impl.torch_versions:<12} {state}")
    for module, why in sorted(dispatch.import_errors.items()):
        print(f"  ({module} did not import: {why})")
    print("tiny program on each path, compared with CPU eager:")
    status = 0
    for name in paths.names():
        if name == "core" and len(paths.names()) > 1:
            print("  core: skipped (the internal base path; views do not alias there)")
            continue
        if support.get(name) is not None:
            print(f"  {name}: skipped (not supported here)")
            continue
        ok, text = _check_path(name)
        print(f"  {name}: {text}")
        if not ok and name == d.path:
            status = 1
    print(f"path used: {d.path} ({d.reason.value})")
    return status


# -- run ----------------------------------------------------------------------------------------

def _configure_run(parser: argparse.ArgumentParser) -> None:
    from xla_compat.dispatch import FLAG_PATHS
    parser.add_argument("--path", choices=sorted(FLAG_PATHS.values()),
                        help="force this path (sets XLA_USE_FUNCTIONALIZATION for the script "
                             "and any process it starts)")
    parser.add_argument("script", help="the Python script to run as __main__")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


@command("run", "run a script as __main__, optionally forcing the path", _configure_run)
def run(args) -> int:
    from xla_compat import dispatch, settings
    sys.argv = [args.script, *args.args]      # the script, not this module, names the job
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    if args.path is not None:
        flag = next(k for k, v in dispatch.FLAG_PATHS.items() if v == args.path)
        os.environ["XLA_USE_FUNCTIONALIZATION"] = "1" if flag else "0"
    settings.reload()
    if dispatch._decision is not None:        # nothing should have touched the device yet
        dispatch.forget_decision()
    runpy.run_path(args.script, run_name="__main__")
    return 0


# -- entry point --------------------------------------------------------------------------------

def main(argv=None) -> int:
    for module in EXTENSIONS:
        importlib.import_module(module)
    parser = argparse.ArgumentParser(prog="python -m xla_compat", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for cmd in COMMANDS.values():
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.configure(p)
    args = parser.parse_args(argv)
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())

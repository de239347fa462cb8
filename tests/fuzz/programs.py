"""Random small PyTorch programs over a few base tensors: views, writes through them, in-place
metadata changes (``t_``, ``squeeze_``, ``as_strided_``, ``resize_``, ...), reads, syncs.

A ``Program`` is a list of Python statements over names ``t0, t1, ...`` (bases) and ``v<k>``
(everything derived). The generator (``programs()``, a hypothesis strategy) builds it one
statement at a time while running it on the CPU, so each drawn argument is valid for the shapes
at hand; a statement that CPU eager rejects is kept as ``with expect_error(Type): ...`` (the
device must reject it with the same exception type and leave every tensor as it was). The same
source runs on CPU eager and on each device path (``run``); ``to_source()`` is a runnable script.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import xla_compat as xc

DTYPES = {"float32": torch.float32, "int64": torch.int64}


@dataclass(frozen=True)
class Stmt:
    """One statement; ``error`` names the exception type CPU eager raised for it (else None)."""

    code: str
    defines: str | None = None
    error: str | None = None
    says: str = ""          # the start of eager's message (for the reader)

    def source(self) -> str:
        if not self.error:
            return self.code
        return f"with expect_error({self.error}, {self.says!r}):\n    {self.code}"


@dataclass(frozen=True)
class Program:
    """Base tensors (shape, dtype name) and the statements run over them."""

    bases: tuple
    stmts: tuple

    def body(self) -> str:
        lines = [f"t{i} = {_base_expr(shape, dtype)}" for i, (shape, dtype) in enumerate(self.bases)]
        return "\n".join(lines + [s.source() for s in self.stmts]) + "\n"

    def to_source(self) -> str:
        return ("import torch\nimport xla_compat as xc\n"
                "from tests.fuzz.programs import expect_error\n\n"
                "dev = xc.device()\nreads = []\n" + self.body())

    def __repr__(self) -> str:      # hypothesis prints falsifying examples with repr()
        return "Program, as a script:\n" + self.to_source()


def _base_expr(shape, dtype) -> str:
    n = 1
    for s in shape:
        n *= s
    return f"torch.arange({n}, dtype=torch.{dtype}).reshape({tuple(shape)}).to(dev)"


@contextlib.contextmanager
def expect_error(kind: type, says: str = ""):
    """The block must raise ``kind`` (CPU eager raised it, with a message starting ``says``)."""
    try:
        yield
    except kind:
        return
    except Exception as e:
        raise AssertionError(f"expected {kind.__name__} ({says}...), got {type(e).__name__}: "
                             f"{e}") from e
    raise AssertionError(f"expected {kind.__name__} ({says}...), nothing was raised")


class _CpuXc:
    """What the program sees as ``xc`` when it runs on CPU eager: sync is a no-op."""

    @staticmethod
    def sync(*args, **kwargs):
        return None

    @staticmethod
    def device():
        return torch.device("cpu")


def namespace(device: str) -> dict:
    cpu = device == "cpu"
    return {"torch": torch, "xc": _CpuXc if cpu else xc, "expect_error": expect_error,
            "dev": torch.device("cpu") if cpu else xc.device(), "reads": []}


def run(program: Program, device: str) -> dict:
    """Run ``program`` on ``"cpu"`` or on the device (on the active path); returns its names."""
    ns = namespace(device)
    exec(compile(program.body(), "<fuzz program>", "exec"), ns)
    return ns


def results(ns: dict) -> dict:
    """name -> tensor for every tensor the program defined, plus ``reads[i]``."""
    out = {k: v for k, v in ns.items() if isinstance(v, torch.Tensor)}
    for i, r in enumerate(ns["reads"]):
        out[f"reads[{i}]"] = r
    return out


# ----------------------------------------------------------------------------------------------
# Generation: each draw_* returns (code, defines) or None; ``programs`` validates on the CPU.

def _ints(draw, lo, hi):
    return draw(st.integers(lo, hi))


def _dim(draw, t):
    return _ints(draw, -t.dim(), t.dim() - 1)


def draw_view(draw, name, t):
    """Source of one view of ``t`` (named ``name``), any kind both paths support."""
    n = t.dim()
    kinds = ["unsqueeze", "alias", "detach", "flatten", "reshape", "view", "as_strided",
             "expand"]
    if n >= 1:
        kinds += ["slice", "narrow", "split", "chunk", "unfold", "squeeze", "unflatten"]
        if t.shape[0] > 0:
            kinds += ["select", "unbind"]
    if n >= 2:
        kinds += ["transpose", "permute", "t", "diagonal", "relaid"]
    kind = draw(st.sampled_from(kinds))
    if kind == "relaid":            # not a view: a copy laid out in another order (strides)
        p = tuple(draw(st.permutations(range(n))))
        inverse = tuple(sorted(range(n), key=p.__getitem__))
        return f"{name}.permute({p}).contiguous().permute({inverse})"
    if kind == "unsqueeze":
        return f"{name}.unsqueeze({_ints(draw, -n - 1, n)})"
    if kind == "alias":
        return f"torch.ops.aten.alias({name})"
    if kind == "detach":
        return f"{name}.detach()"
    if kind == "flatten":
        if n == 0:
            return f"{name}.flatten()"
        a = _ints(draw, 0, n - 1)
        return f"{name}.flatten({a}, {_ints(draw, a, n - 1)})"
    if kind in ("reshape", "view"):
        shape = _factor(draw, t.numel(), t.shape)
        return f"{name}.{kind}({shape})"
    if kind == "as_strided":
        size, stride, offset = _strided(draw, t)
        return f"{name}.as_strided({size}, {stride}, {offset})"
    if kind == "expand":
        k = _ints(draw, 1, 3)
        return f"{name}.expand({(k, *t.shape)})"
    d = _dim(draw, t)
    size = t.shape[d] if n else 1
    if kind == "slice":
        start, stop, step = _ints(draw, -size - 1, size), _ints(draw, -size - 1, size + 1), \
            _ints(draw, 1, 3)
        index = ", ".join([":"] * (d % n) + [f"{start}:{stop}:{step}"])
        return f"{name}[{index}]"
    if kind == "narrow":
        start = _ints(draw, 0, size)
        return f"{name}.narrow({d}, {start}, {_ints(draw, 0, size - start)})"
    if kind in ("split", "chunk"):
        k = _ints(draw, 1, 3)
        parts = len(t.split(k, d)) if kind == "split" else len(t.chunk(k, d))
        return f"{name}.{kind}({k}, {d})[{_ints(draw, 0, max(parts - 1, 0))}]"
    if kind == "unfold":
        return f"{name}.unfold({d}, {_ints(draw, 1, max(size, 1))}, {_ints(draw, 1, 3)})"
    if kind == "squeeze":
        return f"{name}.squeeze({d})" if draw(st.booleans()) else f"{name}.squeeze()"
    if kind == "unflatten":
        return f"{name}.unflatten({d}, {_factor(draw, size, (size,))})"
    if kind == "select":
        return f"{name}.select(0, {_ints(draw, -t.shape[0], t.shape[0] - 1)})"
    if kind == "unbind":
        return f"{name}.unbind(0)[{_ints(draw, 0, t.shape[0] - 1)}]"
    if kind == "transpose":
        return f"{name}.transpose({_dim(draw, t)}, {_dim(draw, t)})"
    if kind == "permute":
        return f"{name}.permute({tuple(draw(st.permutations(range(n))))})"
    if kind == "t":
        return f"{name}.t()" if n == 2 else f"{name}.mT"
    return f"{name}.diagonal({_ints(draw, -2, 2)}, {_dim(draw, t)}, {_dim(draw, t)})"


def _factor(draw, numel, shape):
    """A shape with ``numel`` elements: the same one, a split of a factor, or with a -1."""
    choice = draw(st.sampled_from(["flat", "same", "split", "infer"]))
    if choice == "flat" or not shape:
        return (numel,) if numel or draw(st.booleans()) else (0, 3)
    if choice == "same":
        return tuple(shape)
    if choice == "split":
        for f in (2, 3):
            if numel and numel % f == 0:
                return (f, numel // f)
        return (1, numel)
    return (-1,) + tuple(shape[1:])


def _strided(draw, t):
    """An in-bounds as_strided geometry over ``t``'s storage (eager checks the bound)."""
    storage = t.untyped_storage().nbytes() // t.element_size()
    size = tuple(_ints(draw, 0, 3) for _ in range(_ints(draw, 1, 2)))
    stride = tuple(_ints(draw, 0, 3) for _ in size)
    reach = sum((s - 1) * st_ for s, st_ in zip(size, stride)) if all(size) else -1
    offset = _ints(draw, 0, max(storage - 1 - max(reach, 0), 0))
    return size, stride, offset


def _fresh(t, draw, exact=False) -> str:
    """A fresh device tensor broadcastable to ``t`` (its own storage)."""
    shape = tuple(t.shape)
    if shape and not exact and draw(st.booleans()):
        shape = shape[1:]                         # broadcasts over the leading dim
    n = 1
    for s in shape:
        n *= s
    dtype = str(t.dtype).replace("torch.", "")
    return f"torch.arange({n}, dtype=torch.{dtype}, device=dev).reshape({shape}).mul(-1)"


def draw_write(draw, name, t, others):
    """Source of an in-place or out= write into ``t`` (``others``: (name, tensor) pairs)."""
    kinds = ["add_", "mul_", "fill_", "zero_", "copy_", "clamp_", "masked_fill_", "setitem",
             "out_add", "out_mul", "add_tensor", "copy_host", "out_sum", "addcmul_", "lerp_",
             "masked_scatter_", "div_floor", "out_cumsum", "out_where", "put_"]
    if t.dim() >= 1 and t.shape[0] > 0:
        kinds += ["index_put_", "index_fill_", "index_add_", "index_copy_", "scatter_",
                  "scatter_add_"]
    kind = draw(st.sampled_from(kinds))
    num = draw(st.sampled_from(["2", "-1", "0.5", "3"]))
    if kind in ("index_add_", "index_copy_", "scatter_", "scatter_add_"):
        return _indexed_write(draw, kind, name, t, num)
    if kind == "addcmul_":
        return f"{name}.addcmul_({_source(draw, t, others)}, {_fresh(t, draw)}, value={num})"
    if kind == "lerp_":          # (float only: eager rejects an integer lerp_, kept as an error)
        return f"{name}.lerp_({_source(draw, t, others)}, {num})"
    if kind == "masked_scatter_":
        return (f"{name}.masked_scatter_({name} > {_ints(draw, -1, 6)}, "
                f"torch.arange(max({name}.numel(), 1), dtype={name}.dtype, device=dev)"
                f".reshape(-1).mul(-1))")
    if kind == "out_cumsum":        # a scan's result into t (out= of t's own shape)
        src = _source(draw, t, others, exact=True)
        return f"torch.cumsum({src}, {_dim(draw, t) if t.dim() else 0}, out={name})"
    if kind == "out_where":         # t may be an input of its own out= (eager allows it)
        src = _source(draw, t, others)
        return f"torch.where({name} > {_ints(draw, -1, 6)}, {src}, {name}, out={name})"
    if kind == "put_":              # flat logical positions of t (distinct unless accumulating)
        n = max(t.numel(), 1)
        where = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))
        acc = draw(st.booleans())
        if not acc:
            where = list(dict.fromkeys(w % n for w in where))
        return (f"{name}.put_(torch.tensor({where}, device=dev), torch.arange({len(where)}, "
                f"dtype={name}.dtype, device=dev).mul(-1), accumulate={acc})")
    if kind == "div_floor":
        return f"{name}.div_({draw(st.sampled_from(['2', '-3']))}, rounding_mode='floor')"
    if kind == "add_":
        return f"{name}.add_({num})"
    if kind == "mul_":
        return f"{name}.mul_({num})"
    if kind == "fill_":
        return f"{name}.fill_({num})"
    if kind == "zero_":
        return f"{name}.zero_()"
    if kind == "clamp_":
        lo = _ints(draw, -2, 4)
        return f"{name}.clamp_({lo}, {lo + _ints(draw, 0, 6)})"
    if kind == "masked_fill_":
        return f"{name}.masked_fill_({name} > {_ints(draw, -1, 6)}, {num})"
    if kind == "setitem":
        if t.dim() == 0 or t.shape[0] == 0:
            return f"{name}[...] = {num}"
        return f"{name}[{_ints(draw, -t.shape[0], t.shape[0] - 1)}] = {num}"
    if kind == "index_put_":
        rows = draw(st.lists(st.integers(-t.shape[0], t.shape[0] - 1), min_size=1, max_size=3))
        acc = draw(st.booleans())
        if not acc:       # eager leaves the winner of duplicate indices unspecified
            rows = list(dict.fromkeys(r % t.shape[0] for r in rows))
        return (f"{name}.index_put_((torch.tensor({rows}, device=dev),), "
                f"torch.tensor({num}, dtype={name}.dtype, device=dev), accumulate={acc})")
    if kind == "index_fill_":
        rows = list(dict.fromkeys(r % t.shape[0] for r in draw(
            st.lists(st.integers(-t.shape[0], t.shape[0] - 1), min_size=1, max_size=3))))
        return f"{name}.index_fill_(0, torch.tensor({rows}, device=dev), {num})"
    if kind == "copy_host":         # from a host tensor (its layout must not become t's)
        return f"{name}.copy_({_fresh(t, draw).replace(', device=dev', '')})"
    if kind == "out_sum":           # a reduction's result into t (keeps t's layout)
        dtype = str(t.dtype).replace("torch.", "")
        shape = (*t.shape, 2)
        return (f"torch.sum(torch.arange({math.prod(shape)}, dtype=torch.{dtype}, device=dev)"
                f".reshape({shape}), -1, out={name})")
    src = _source(draw, t, others, exact=kind.startswith("out_"))
    if kind == "copy_":
        return f"{name}.copy_({src})"
    if kind == "add_tensor":
        return f"{name}.add_({src})"
    op = "add" if kind == "out_add" else "mul"
    return f"torch.{op}({src}, {num}, out={name})"


def _indexed_write(draw, kind, name, t, num):
    """``index_add_``/``index_copy_`` along dim 0 or ``scatter_``/``scatter_add_`` along a dim,
    from a fresh source; distinct indices where eager leaves the winner of duplicates open."""
    n = t.shape[0]
    rows = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3))
    dtype = str(t.dtype).replace("torch.", "")
    if kind in ("index_add_", "index_copy_"):
        if kind == "index_copy_":
            rows = list(dict.fromkeys(r % n for r in rows))
        shape = (len(rows), *t.shape[1:])
        src = (f"torch.arange({math.prod(shape)}, dtype=torch.{dtype}, device=dev)"
               f".reshape({shape}).mul(-1)")
        extra = f", alpha={num}" if kind == "index_add_" and draw(st.booleans()) else ""
        return f"{name}.{kind}(0, torch.tensor({rows}, device=dev), {src}{extra})"
    # scatter along dim d: an index of t's shape but at most len(rows) along d
    d = _dim(draw, t)
    shape = list(t.shape)
    shape[d] = min(len(rows), shape[d])
    if 0 in shape:
        return f"{name}.{kind}({d}, torch.zeros({tuple(shape)}, dtype=torch.long, device=dev), 1)"
    size = t.shape[d]
    if kind == "scatter_":      # distinct targets along d for every other position
        perm = [r % size for r in dict.fromkeys(r % size for r in rows)][:shape[d]]
        perm += [i for i in range(size) if i not in perm][:shape[d] - len(perm)]
        index = (f"torch.tensor({perm}, device=dev).reshape("
                 f"{tuple(len(perm) if i == d else 1 for i in range(t.dim()))})"
                 f".expand({tuple(shape)}).contiguous()")
    else:
        index = (f"torch.tensor({[r % size for r in rows][:shape[d]]}, device=dev).reshape("
                 f"{tuple(shape[d] if i == d else 1 for i in range(t.dim()))})"
                 f".expand({tuple(shape)}).contiguous()")
    src = (f"torch.arange({math.prod(shape)}, dtype=torch.{dtype}, device=dev)"
           f".reshape({tuple(shape)}).mul(-1)")
    return f"{name}.{kind}({d}, {index}, {src})"


def draw_restride(draw, name, t, others=()):
    """Source of an in-place metadata change of ``t`` (``t_``, ``transpose_``, ``unsqueeze_``,
    ``squeeze_``, ``swapdims_``, ``as_strided_``, ``resize_``): the tensor object
    keeps its storage and takes another geometry; later statements see the new one. Or ``t``
    takes another live tensor's storage and geometry (``set_``, ``.data =``), after which a
    write through either is seen through the other (``others``: (name, tensor) pairs)."""
    n = t.dim()
    kinds = ["unsqueeze_", "as_strided_"]
    room = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    if room >= 0:         # (eager grows a storage an empty view's offset lies past: see below)
        kinds += ["resize_"]
    same = [o for o, x in others if x.dtype == t.dtype and o != name]
    if same:
        kinds += ["set_", "data"]
    if others:
        kinds += ["data"]          # (another dtype too: .data = takes it)
    if n >= 1:
        kinds += ["squeeze_"]
    if n >= 2:
        kinds += ["t_", "transpose_", "swapdims_"]
    kind = draw(st.sampled_from(kinds))
    if kind == "set_":
        return f"{name}.set_({draw(st.sampled_from(same))})"
    if kind == "data":
        return f"{name}.data = {draw(st.sampled_from([o for o, _ in others]))}"
    if kind == "unsqueeze_":
        return f"{name}.unsqueeze_({_ints(draw, -n - 1, n)})"
    if kind == "squeeze_":
        return f"{name}.squeeze_({_dim(draw, t)})" if draw(st.booleans()) else f"{name}.squeeze_()"
    if kind == "t_":
        return f"{name}.t_()" if n == 2 else f"{name}.transpose_(-2, -1)"
    if kind in ("transpose_", "swapdims_"):
        return f"{name}.{kind}({_dim(draw, t)}, {_dim(draw, t)})"
    if kind == "as_strided_":
        size, stride, offset = _strided(draw, t)
        return f"{name}.as_strided_({size}, {stride}, {offset})"
    # resize_ to explicit sizes (eager keeps a -1 it refuses): within the elements the tensor has
    # and its storage holds, or past the end of the storage, which grows in place with
    # uninitialised memory: the same statement writes the new elements before anything reads them
    grow = draw(st.booleans())
    k = _ints(draw, room + 1, room + 6) if grow else _ints(draw, 0, min(t.numel(), room))
    f = draw(st.sampled_from([f for f in (1, 2, 3) if k % f == 0]))
    resize = f"{name}.resize_({(f, k // f) if f > 1 else (k,)})"
    return f"{resize}; {name}.view(-1)[{room}:] = {_ints(draw, -3, 3)}" if grow else resize


def _source(draw, t, others, exact=False):
    """Another live tensor broadcastable to ``t`` (may share its storage), or a fresh one.

    ``exact``: of ``t``'s own shape (an out= tensor of another shape would be resized)."""
    fits = [n for n, o in others
            if (o.shape == t.shape if exact else _broadcasts(o.shape, t.shape))]
    if fits and draw(st.booleans()):
        return draw(st.sampled_from(fits))
    return _fresh(t, draw, exact)


def _broadcasts(src, dst) -> bool:
    if len(src) > len(dst):
        return False
    return all(s in (1, d) for s, d in zip(reversed(src), reversed(dst)))


def draw_read(draw, name, t):
    kind = draw(st.sampled_from(["cpu", "clone", "sum", "contiguous"]))
    if kind == "cpu":
        return f"reads.append({name}.cpu().clone())"
    if kind == "clone":
        return f"reads.append({name}.clone())"
    if kind == "contiguous":
        return f"reads.append({name}.contiguous() * 1)"
    return f"reads.append({name}.sum())" if t.dtype != torch.bool else f"reads.append({name}.any())"


@st.composite
def programs(draw, max_bases: int = 3, max_stmts: int = 12, errors: bool = True) -> Program:
    """A random program, validated statement by statement on the CPU."""
    bases = []
    for _ in range(_ints(draw, 1, max_bases)):
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
        dtype = draw(st.sampled_from(["float32", "float32", "float32", "int64"]))
        bases.append((shape, dtype))
    prog = Program(tuple(bases), ())
    ns = run(prog, "cpu")
    names = [f"t{i}" for i in range(len(bases))]
    stmts: list[Stmt] = []
    for _ in range(_ints(draw, 1, max_stmts)):
        kind = draw(st.sampled_from(["view", "view", "view", "write", "write", "write", "read",
                                     "sync", "restride"]))
        name = draw(st.sampled_from(names))
        t = ns[name]
        defines = None
        if kind == "view":
            defines = f"v{len(names)}"
            code = f"{defines} = {draw_view(draw, name, t)}"
        elif kind == "write":
            code = draw_write(draw, name, t, [(n, ns[n]) for n in names])
        elif kind == "restride":
            code = draw_restride(draw, name, t, [(n, ns[n]) for n in names])
        elif kind == "read":
            code = draw_read(draw, name, t)
        else:
            code = "xc.sync()"
        stmt = _validated(Stmt(code, defines), ns)
        if stmt is None or (stmt.error and not errors):
            continue
        stmts.append(stmt)
        if stmt.defines and not stmt.error:
            names.append(stmt.defines)
    return Program(tuple(bases), tuple(stmts))


def _validated(stmt: Stmt, ns: dict) -> Stmt | None:
    """Run ``stmt`` on the CPU namespace; an error becomes an expected error (if nothing changed)."""
    before = {k: v.clone() for k, v in ns.items() if isinstance(v, torch.Tensor)}
    try:
        exec(stmt.code, ns)
    except (RuntimeError, IndexError, TypeError, ValueError) as e:
        for k, v in before.items():     # eager must not have written before it raised
            if not torch.equal(ns[k], v):
                return None
        return Stmt(stmt.code, stmt.defines, _error_name(e), str(e).split("\n")[0][:60])
    return stmt


def _error_name(e: Exception) -> str:
    for kind in (IndexError, TypeError, ValueError, NotImplementedError, RuntimeError):
        if isinstance(e, kind):
            return kind.__name__
    return "Exception"

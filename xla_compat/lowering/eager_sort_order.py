"""libstdc++ ``std::sort`` as eager CPU runs it (sort/argsort without stable=True, mode): the same
introsort partitions, so equal elements come out in eager's order, not the stable one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ._helpers import is_float

# Each partition costs O(row length); beyond this length the stable order is used instead
# (PyTorch leaves the order of ties unspecified there; only indices of equal values differ).
MAX_EMULATED = 8192
INSERTION_THRESHOLD = 16  # libstdc++ _S_threshold


def _lt(x, y):  # KeyValueCompAsc: NaN after every number
    if is_float(x.dtype):
        return (~jnp.isnan(x) & jnp.isnan(y)) | (x < y)
    return x < y


def _gt(x, y):  # KeyValueCompDesc: NaN before every number
    if is_float(x.dtype):
        return (jnp.isnan(x) & ~jnp.isnan(y)) | (x > y)
    return x > y


def _partition(a, ix, lo, hi, comp):
    """__unguarded_partition_pivot on [lo, hi): median of three moved to lo, then Hoare. The m-th
    left stop (not comp(a, pivot)) swaps with the m-th right stop (not comp(pivot, a)) while they
    have not crossed, so the whole pass is computed at once. Returns the cut."""
    n = a.shape[0]
    pos, far = jnp.arange(n), n + 8
    mid = lo + (hi - lo) // 2
    x, y, z = a[lo + 1], a[mid], a[hi - 1]
    pick = jnp.where(comp(x, y),
                     jnp.where(comp(y, z), mid, jnp.where(comp(x, z), hi - 1, lo + 1)),
                     jnp.where(comp(x, z), lo + 1, jnp.where(comp(y, z), hi - 1, mid)))
    a = a.at[lo].set(a[pick]).at[pick].set(a[lo])
    ix = ix.at[lo].set(ix[pick]).at[pick].set(ix[lo])
    piv = a[lo]
    inside = (pos >= lo + 1) & (pos <= hi - 1)
    lstop, rstop = inside & ~comp(a, piv), inside & ~comp(piv, a)
    rl, rr = jnp.cumsum(lstop), jnp.cumsum(rstop[::-1])[::-1]  # 1-based ranks from each end
    p = jnp.full(n + 2, far).at[0].set(-1).at[jnp.where(lstop, rl, far)].set(pos, mode="drop")
    q = jnp.full(n + 2, -1).at[0].set(far).at[jnp.where(rstop, rr, far)].set(pos, mode="drop")
    m = jnp.sum(p[1:] < q[1:])
    src = jnp.where(lstop & (rl <= m), q[rl], pos)
    src = jnp.where(rstop & (rr <= m), p[rr], src)
    return a[src], ix[src], jnp.minimum(p[m + 1], q[m])


def _introsort_blocks(a, descending):
    """The introsort loop on one row: every block left is <= 16 long. Blocks are disjoint, so a
    stack replaces the recursion. (The depth limit's heapsort is not emulated: it needs
    2*log2(n) unbalanced partitions in a row, which ties and random data do not produce.)"""
    n = a.shape[0]
    comp = _gt if descending else _lt

    def step(s):
        a, ix, stack, top = s
        top = top - 1
        lo, hi = stack[top, 0], stack[top, 1]
        big = hi - lo > INSERTION_THRESHOLD
        a2, ix2, cut = _partition(a, ix, lo, jnp.maximum(hi, lo + 3), comp)
        stack = stack.at[top].set(jnp.where(big, jnp.stack([cut, hi]), stack[top]))
        stack = stack.at[top + 1].set(jnp.where(big, jnp.stack([lo, cut]), stack[top + 1]))
        return (jnp.where(big, a2, a), jnp.where(big, ix2, ix), stack,
                jnp.where(big, top + 2, top))

    stack = jnp.zeros((n // 8 + 64, 2), jnp.int64).at[0].set(jnp.array([0, n]))
    init = (a, jnp.arange(n, dtype=jnp.int64), stack, jnp.int64(1))
    a, ix, _, _ = lax.while_loop(lambda s: s[3] > 0, step, init)
    return a, ix


def std_sort_last(x, descending, stable_sort_last):
    """Sort along the last axis in eager's std::sort order: (values, int64 indices).
    ``stable_sort_last`` is the stable sort that finishes the job: the final insertion sort
    is stable and no element leaves its block."""
    n = x.shape[-1]
    if n > MAX_EMULATED or n <= INSERTION_THRESHOLD or x.size == 0:
        return stable_sort_last(x, descending)
    keys = x.astype(jnp.uint8) if x.dtype == jnp.bool_ else x
    rows = jnp.reshape(keys, (-1, n))
    rows, ix = jax.vmap(lambda r: _introsort_blocks(r, descending))(rows)
    _, perm = stable_sort_last(rows, descending)
    ix = jnp.take_along_axis(ix, perm, axis=-1)
    ix = jnp.reshape(ix, x.shape)
    return jnp.take_along_axis(x, ix, axis=-1), ix

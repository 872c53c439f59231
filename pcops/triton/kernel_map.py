"""Launchers of the Triton kernel-map kernels (``pcops.triton.kernel_map_kernels``, which also
describes the hash tables, the lookup and the compaction): plans cached per configuration, one
int64 workspace, the launches and the one host sync each output size needs.
"""

from __future__ import annotations

import functools
import logging
import math

import torch

from . import _launch

from .kernel_map_kernels import (
    _kmap_insert_kernel,
    _kmap_scatter_kernel,
    _kmap_bits_count_kernel,
    _kmap_bits_emit_kernel,
    _kmap_lookup_kernel,
    _kmap_count_kernel,
    _kmap_compact_kernel,
)

# (row, offset) lanes per program in the 2-D passes (32 rows × 32 offsets for 3×3×3: 8 lanes
# per thread at 4 warps, few enough int64 temporaries to stay in registers; the tile sweep is in
# benchmarks/NOTES.md)
_TILE = 1024
_NUM_WARPS = 4
# the hash tables hold at least this many slots
_MIN_CAPACITY = 16
# lanes per program in the insert pass: small, since a tile probes until its slowest lane is done
_INSERT_LANES = 128
# idle lanes of concurrent programs CAS different sink copies
_SINK_COPIES = 16
# at most this many count groups: each compaction program reads all of them (G·KPAD int64)
_MAX_GROUPS = 256
# group-count rows reduced per step in the compaction (S1: all groups in one step)
_COUNT_CHUNK = 256
# (row, offset) lanes ranked per step of the compaction: one 64 × 32 tile keeps it at 118
# registers (2 programs per SM, S1's ≤ 256 groups in one wave); the counts of all groups are
# reduced in one step
_COMPACT_LANES = 2048
# rows are merged as ``_ROW_BASE - row`` with atomic_max (−1 = empty is below every row)
_ROW_BASE = 1 << 40
# static-shape maps: bitmap words per program of the count and ranking passes, cells ranked per step
_BITS_WORDS = 512
_BITS_CELLS = 4096
# (input, candidate) lanes per program of the static regular map's scatter pass
_SCATTER_LANES = 1024
# counter cells (after the group counts): M - 1, max batch, P - 1 and the submanifold mirror flag
# (all start at -1), each on its own 128-byte line (the M counter takes an atomic per probe round
# of every program)
_COUNTER_STRIDE = 16
_NUM_COUNTERS = 4 * _COUNTER_STRIDE


# --- launchers ------------------------------------------------------------------------------


def _pow2(v: int) -> int:
    """The next power of two ≥ ``v`` (1 for ``v ≤ 1``)."""
    return 1 << max(0, v - 1).bit_length()


def _tile(num_k: int) -> tuple[int, int]:
    """``(rows per program, padded offsets)`` for the 2-D passes."""
    kpad = max(2, _pow2(num_k))
    return max(2, _TILE // kpad), kpad


def _capacity(count: int, slack: int = 2) -> tuple[int, int]:
    """Power-of-two table size ≥ slack × count (load ≤ 1/slack) and its log2."""
    cap = max(_MIN_CAPACITY, _pow2(slack * max(1, count)))
    return cap, cap.bit_length() - 1


def _groups(num_blocks: int) -> tuple[int, int]:
    """``(blocks per count group, groups)`` with at most ``_MAX_GROUPS`` groups."""
    sub = _launch.cdiv(num_blocks, _MAX_GROUPS)
    return sub, _launch.cdiv(num_blocks, sub)


@functools.lru_cache(maxsize=256)
def _axis_enumeration(kernel_size: tuple, stride: tuple, dilation: tuple, transposed: bool):
    """Per axis ``(g, q, inv, J)``: the offsets ``k`` with ``k * d = r (mod s)`` are
    ``k0 + j * q`` (``q = s / g``, ``g = gcd(d, s)``, ``k0 = (r / g) * inv mod q``, needs
    ``g | r``), at most ``J = ceil(K / q)`` of them; transposed: all ``K`` (``q = 1``)."""
    axes = []
    for k, s, d in zip(kernel_size, stride, dilation):
        if transposed:
            axes.append((1, 1, 0, k))
            continue
        g = math.gcd(d, s)
        q = s // g
        inv = pow(d // g, -1, q) if q > 1 else 0
        axes.append((g, q, inv, -(-k // q)))
    return tuple(axes)


def max_outputs_per_input(kernel_size, stride, dilation, transposed: bool) -> int:
    """How many distinct outputs one input voxel can reach (bounds the output table)."""
    return math.prod(a[3] for a in _axis_enumeration(tuple(kernel_size), tuple(stride), tuple(dilation), transposed))


@functools.lru_cache(maxsize=256)
def _plan(
    in_shape: tuple,
    out_shape: tuple,
    kernel_size: tuple,
    stride: tuple,
    padding: tuple,
    dilation: tuple,
    subm: bool,
    transposed: bool,
) -> dict:
    """Everything about a call that does not depend on N (cached: the host time is the budget)."""
    num_k = math.prod(kernel_size)
    block, kpad = _tile(num_k)
    axes = _axis_enumeration(kernel_size, stride, dilation, transposed)
    per_input = 0 if subm else math.prod(a[3] for a in axes)
    # a submanifold table-only map of an odd kernel (centred: offsets k and K - 1 - k are opposite)
    # probes half the offsets and mirrors the rest (kernel_map_kernels._kmap_lookup_kernel)
    mirror = subm and all(k % 2 == 1 for k in kernel_size)
    kpad_half = max(2, _pow2(num_k // 2 + 1))
    jpad = _pow2(per_input) if per_input else 1
    # candidate generation: 2x the lanes (one counter atomic per program)
    block_n = _INSERT_LANES if subm else max(2, 2 * _INSERT_LANES // jpad)
    geometry = {}
    for axis, k, s, p, d in zip("zyx", kernel_size, stride, padding, dilation):
        geometry.update({"s" + axis: s, "p" + axis: p, "d" + axis: d})
    enum = {}
    for axis, (g, q, inv, _) in zip("zyx", axes):
        enum.update({"g" + axis: g, "q" + axis: q, "v" + axis: inv})
    # the candidate enumeration's compile-time geometry (the insert and scatter passes)
    candidates = dict(
        Kz=kernel_size[0],
        Ky=kernel_size[1],
        Kx=kernel_size[2],
        **geometry,
        **enum,
        Jy=axes[1][3],
        Jx=axes[2][3],
        J=max(per_input, 1),
        JPAD=jpad,
        K=num_k,
    )
    return dict(
        num_k=num_k,
        block=block,
        kpad=kpad,
        mirror=mirror,
        block_half=max(2, _TILE // kpad_half),
        kpad_half=kpad_half,
        per_input=per_input,
        jpad=jpad,
        block_n=block_n,
        insert_warps=4,
        sink=_SINK_COPIES * block_n * jpad,
        in_shape=in_shape,
        out_shape=out_shape,
        insert_consts=dict(
            **candidates,
            GEN=not subm,
            TRANSPOSED=transposed,
            COPY=subm,
            BLOCK_N=block_n,
            KHPAD=max(2, _pow2(num_k // 2)),
        ),
        scatter_consts=dict(**candidates, BLOCK_N=max(2, _SCATTER_LANES // jpad)),
        lookup_consts=dict(
            K=num_k,
            Ky=kernel_size[1],
            Kx=kernel_size[2],
            **geometry,
            FROM_KEYS=not subm,
            TRANSPOSED=transposed,
        ),
    )


def _empty_map(dev, num_out: int, num_k: int, out_coords=None, pairs: bool = True, count: bool = False):
    """No outputs. ``offsets``: ``K + 1`` zeros with pairs; without, ``(1,)`` zero (``count``:
    a static regular map's ``M``) or empty."""
    empty = torch.empty(0, dtype=torch.int32, device=dev)
    if out_coords is None:
        out_coords = torch.empty((num_out, 4), dtype=torch.int32, device=dev)
    return (
        out_coords,
        empty,
        empty.clone(),
        torch.zeros(num_k + 1 if pairs else int(count), dtype=torch.int32, device=dev),
        torch.empty((num_out, num_k), dtype=torch.int32, device=dev),
    )


def _compact(out_in, counts, counts_off, sub, num_groups, block_m, kpad, cap_pairs, pad, m_off=None, record=None):
    """Pairs (``cap_pairs`` long) and offsets from the out-in table and its group counts
    (``counts[counts_off:]``; ``counts[m_off] + 1`` = the rows holding hits when given): 1 launch."""
    num_out, num_k = out_in.shape
    dev = out_in.device
    pair_in = torch.empty(cap_pairs, dtype=torch.int32, device=dev)
    pair_out = torch.empty(cap_pairs, dtype=torch.int32, device=dev)
    offsets = torch.empty(num_k + 1, dtype=torch.int32, device=dev)
    args = (
        out_in,
        counts,
        pair_in,
        pair_out,
        offsets,
        counts_off,
        num_out,
        num_k,
        sub,
        num_groups,
        cap_pairs,
        m_off or 0,
    )
    meta = dict(
        BLOCK_M=block_m,
        KPAD=kpad,
        CHUNK=max(2, min(_COUNT_CHUNK, _COMPACT_LANES // kpad)),
        ROWS=block_m * (1 if m_off is not None else min(sub & -sub, max(1, _COMPACT_LANES // (block_m * kpad)))),
        PAD=pad,
        DEV_M=m_off is not None,
        TAIL=1024,
        num_warps=_NUM_WARPS,
    )
    _launch.launch(_kmap_compact_kernel, (num_groups,), *args, **meta)
    if record is not None:
        record.append((_kmap_compact_kernel, (num_groups,), args, meta))
    return pair_in, pair_out, offsets


def pairs_from_table(out_in: torch.Tensor, pad_pairs: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs layout of an out-in table.

    Args:
        out_in: ``(M, K)`` int32 contiguous, −1 for no input.
        pad_pairs: return pairs of length ``M·K`` (entries past ``offsets[K]`` are −1) and
            skip the host sync.
    Returns:
        ``pair_in, pair_out (P,)`` int32 grouped by offset, ascending output within an offset,
        and ``offsets (K+1,)`` int32. 3 launches (fill, count, compact); one host sync (P) at the
        end, none with ``pad_pairs``.
    """
    num_out, num_k = out_in.shape
    dev = out_in.device
    if num_out == 0:
        return _empty_map(dev, 0, num_k)[1:4]
    block_m, kpad = _tile(num_k)
    nb = _launch.cdiv(num_out, block_m)
    sub, num_groups = _groups(nb)
    counts = torch.full((num_groups * kpad,), -1, dtype=torch.int64, device=dev)
    _launch.launch(
        _kmap_count_kernel, (nb,), out_in, counts, num_out, sub, num_k, BLOCK_M=block_m, KPAD=kpad, num_warps=_NUM_WARPS
    )
    pair_in, pair_out, offsets = _compact(out_in, counts, 0, sub, num_groups, block_m, kpad, num_out * num_k, pad_pairs)
    if not pad_pairs:
        num_pairs = int(offsets[num_k : num_k + 1].cpu()[0])  # host sync: the pair count is an output size
        pair_in, pair_out = pair_in[:num_pairs], pair_out[:num_pairs]
    return pair_in, pair_out, offsets


def sparse_conv_kernel_map(
    coords: torch.Tensor,
    in_shape,
    out_shape,
    kernel_size,
    stride,
    padding,
    dilation,
    subm: bool,
    transposed: bool,
    pad_pairs: bool = False,
    static_shapes: bool = False,
    batch_size: int = 0,
    pairs: bool = True,
    max_outputs: int = 0,
    in_index=None,
    index_out: bool = False,
) -> tuple:
    """Kernel map on the GPU (or on CPU tensors under the Triton interpreter).

    Args:
        coords: ``(N, 4)`` int32 contiguous ``(batch, z, y, x)``; out-of-grid rows are never
            inputs; duplicates: the lowest row is the input found.
        in_shape, out_shape: ``(D, H, W)`` grids; kernel_size, stride, padding, dilation: 3-lists
            (submanifold: stride 1 and the centred padding, as the public function passes).
        pad_pairs: pairs of length ``M·K`` (the bound; entries past ``offsets[K]`` are −1).
        static_shapes: no host sync at all; submanifold as ``pad_pairs``; regular/transposed
            outputs padded to ``N·J`` rows and pairs (see ``pcops.sparse_conv_kernel_map``):
            candidates clear their bit in a bitmap of the ``batch_size`` output grids (no
            output table, no sort); a count pass and a ranking pass over the bitmap's chunks
            write the keys in order and ``M``, which the lookup and compaction read on the
            device. 6 launches; table only (``pairs=False``, not transposed, no ``in_index``):
            5, the lookup replaced by a scatter from the input side (``_kmap_scatter_kernel``:
            each input writes its row into the outputs it reaches, ranked in the bitmap; the
            insert pass sets the table to -1 first).
        batch_size: static regular/transposed maps: the samples covered (inputs of later
            samples are never inputs).
        pairs: ``False``: no compaction launch (and no host sync for a submanifold map); the
            pair arrays are empty, and so is ``offsets`` except for a static regular/transposed
            map, where it is ``(1,)`` int32: the output count ``M`` on the device (before any
            ``max_outputs`` cut).
        max_outputs: static regular/transposed maps: at most this many output rows (``0``: the
            bound ``N·J``); the outputs past it, last in key order, are dropped.
        in_index: static regular/transposed maps whose ``coords`` are the output rows of an
            earlier static regular map (``index_out``): that map's ``(bits, prefix, rows,
            cells)``; the inputs are found in its bitmap (no hash table). The caller vouches
            that the index is that of ``coords``.
        index_out: static regular/transposed maps: also return the output bitmap index
            ``(bits, prefix)``, both ``(cells / 32,)`` int32 (``subm_table_from_index``).
    Returns:
        ``(out_coords (M, 4), pair_in (P,), pair_out (P,), offsets (K+1,), out_in (M, K))``, all
        int32, equal to ``reference.kernel_map.sparse_conv_kernel_map`` (``index_out``: then
        ``bits, prefix``, equal to ``reference.kernel_map.bitmap_index``). A submanifold
        table-only map of odd kernel sizes probes the offsets up to the centre and mirrors the
        rest (``kernel_map_kernels._kmap_lookup_kernel``, ``HALF``).
        Launches: 4 (submanifold), 4 + ``torch.sort``'s (regular/transposed). Host syncs:
        submanifold one, for P, after every launch is queued (none with ``pad_pairs``: the
        whole map can be captured in a CUDA graph); regular/transposed exactly one, for M (P
        and the largest batch index come with it); the pair arrays of the non-padded
        submanifold map are views of ``N·K``-long buffers.
    """
    dev = coords.device
    n = coords.shape[0]
    plan = _plan(
        tuple(in_shape),
        tuple(out_shape),
        tuple(kernel_size),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        bool(subm),
        bool(transposed),
    )
    num_k, block, kpad = plan["num_k"], plan["block"], plan["kpad"]
    static_out = static_shapes and not subm
    if (in_index is not None or index_out) and not static_out:
        raise ValueError("in_index, index_out: only for static regular/transposed maps")
    if n == 0:
        empty = _empty_map(dev, 0, num_k, pairs=pairs, count=static_out)
        if index_out:  # no outputs: every bit set (empty), every prefix 0
            words = _launch.cdiv(batch_size * math.prod(out_shape), 32)
            return empty + (
                torch.full((words,), -1, dtype=torch.int32, device=dev),
                torch.zeros(words, dtype=torch.int32, device=dev),
            )
        return empty
    idx = in_index is not None
    # load ≤ 1/4: a lookup tile probes until its slowest lane stops, so short probe tails matter
    cap_in, log_in = _capacity(1 if idx else n, 4)  # from an input index: no table (the smallest)
    pad_pairs = pad_pairs or static_shapes
    if subm:
        bound, cap_out, log_out = 0, 0, 0
        sub, num_groups = _groups(_launch.cdiv(n, block))
    elif static_out:
        bound = n * plan["per_input"]
        cap_out, log_out = 0, 0  # no output table: a bitmap of the output cells
        # groups split the M rows on the device; the lookup gets the group count as `sub`
        num_groups = min(_MAX_GROUPS, _launch.cdiv(bound, block))
        sub = num_groups
        cells = batch_size * math.prod(out_shape)
        if cells >= 2**31:
            raise ValueError(
                f"batch_size: {batch_size} samples of the output grid {tuple(out_shape)} exceed the "
                f"static form's bitmap (2^31 cells); use static_shapes=False"
            )
        words = _launch.cdiv(cells, 32)
        chunks = _launch.cdiv(words, _BITS_WORDS)
    else:
        bound = n * plan["per_input"]
        # ≥ bound + 1 slots can never fill up; the real load is far lower (S1: 73k outputs of 354k candidates)
        cap_out, log_out = _capacity(bound + 1, 1)
        sub, num_groups = 1, _MAX_GROUPS  # the group count is known after the sync; reserve the most
    counts_off = 2 * cap_in + cap_out
    counters_off = counts_off + num_groups * kpad
    sink_off = counters_off + _NUM_COUNTERS
    # static shapes: the N·J output keys (the first M used), then the bitmap and the chunk sums (int32)
    keys_off = sink_off + plan["sink"]
    bits_off = keys_off + bound
    sums_off = bits_off + (_launch.cdiv(words, 2) if static_out else 0)
    ws_len = sums_off + (_launch.cdiv(chunks, 2) if static_out else 0)
    # a static regular table-only map of hashed inputs fills its out-in table from the input side
    # (the scatter pass: one probe per input instead of K per output); the insert pass first sets
    # it to -1. With an input index the per-output lookup is two loads and stays (benchmarks/NOTES.md)
    scatter = static_out and not pairs and not transposed and not idx
    num_out = (min(bound, max_outputs) if max_outputs > 0 else bound) if static_out else 0
    if ws_len >= 2**31:
        raise ValueError(f"coords: {n} voxels need hash tables of {2 * cap_in + cap_out} slots (limit 2^31)")
    ws = torch.full((ws_len,), -1, dtype=torch.int64, device=dev)  # launch 1 (the bitmap: all ones = empty)
    bits = ws[bits_off:sums_off].view(torch.int32) if static_out else ws
    mirror = plan["mirror"] and not pairs
    out_in = None
    if subm:  # no candidate keys: any pointer will do for the unused arguments
        out_keys, out_keys32 = ws, coords
        out_coords = torch.empty((n, 4), dtype=torch.int32, device=dev)
        if mirror:  # the insert pass sets its upper half to -1
            out_in = torch.empty((n, num_k), dtype=torch.int32, device=dev)
    elif static_out:
        if scatter:  # the insert pass sets it to -1
            out_in = torch.empty((num_out, num_k), dtype=torch.int32, device=dev)
        out_keys, out_keys32 = ws[keys_off:], coords
        out_coords = coords  # unused (COPY is off)
    else:
        out_keys = torch.empty(bound, dtype=torch.int64, device=dev)
        out_keys32 = torch.empty(bound, dtype=torch.int32, device=dev)
        out_coords = coords  # unused (COPY is off)
    block_n = plan["block_n"]
    # the launches, for the native host path (submanifold maps, and regular/transposed maps of the
    # default form, with pairs: the native table-only maps differed from this path's in GPU tests,
    # csrc/host/kernel_map.cpp)
    record = [] if coords.is_cuda and pairs and (subm or not (static_out or idx)) else None
    insert_args = (
        coords,
        ws,
        out_keys,
        out_keys32,
        out_coords,
        bits,
        out_in if mirror or scatter else coords,
        n,
        num_out * num_k if scatter else 0,
        batch_size,
        *plan["in_shape"],
        cap_in,
        log_in,
        max(cap_out, 1),
        log_out,
        counters_off,
        sink_off,
        *plan["out_shape"],
    )
    insert_meta = dict(
        **plan["insert_consts"],
        ROW_BASE=_ROW_BASE,
        SINK_COPIES=_SINK_COPIES,
        CSTRIDE=_COUNTER_STRIDE,
        KEYS32=not (subm or static_out),
        BITMAP=static_out,
        TABLE=not idx,
        MIRROR=mirror,
        FILL=scatter,
        num_warps=plan["insert_warps"],
    )
    _launch.launch(_kmap_insert_kernel, (_launch.cdiv(n, block_n),), *insert_args, **insert_meta)  # launch 2
    if record is not None:
        record.append((_kmap_insert_kernel, (_launch.cdiv(n, block_n),), insert_args, insert_meta))
    if subm:
        num_out, keys = n, ws  # keys unused (FROM_KEYS is off)
    elif static_out:
        # no sync, no sort: the cleared bits, counted per chunk and ranked, are the outputs in key order
        sums = ws[sums_off:].view(torch.int32)
        _launch.launch(_kmap_bits_count_kernel, (chunks,), bits, sums, words, WORDS=_BITS_WORDS, num_warps=4)
        keys = ws[keys_off:bits_off]
        prefix = torch.empty(words, dtype=torch.int32, device=dev) if index_out or scatter else bits
        _launch.launch(
            _kmap_bits_emit_kernel,
            (chunks,),
            bits,
            sums,
            keys,
            ws,
            prefix,
            counters_off,
            words,
            chunks,
            WORDS=_BITS_WORDS,
            CELLS=_BITS_CELLS,
            SUMS=min(1024, _pow2(chunks)),
            PREFIX=index_out or scatter,
            num_warps=8,
        )
        out_coords = torch.empty((num_out, 4), dtype=torch.int32, device=dev)
    else:
        # the one host sync: the output count M (with P and the largest batch index)
        counters = ws[counters_off : counters_off + 3 * _COUNTER_STRIDE].tolist()  # contiguous: one plain copy
        last, max_batch, last_pair = counters[: 3 * _COUNTER_STRIDE : _COUNTER_STRIDE]
        num_out, num_pairs = last + 1, last_pair + 1
        if num_out == 0:
            return _empty_map(dev, 0, num_k, pairs=pairs)
        # linear keys sort lexicographically by (b, z, y, x); int32 keys when they fit (half the radix passes)
        fits32 = (max_batch + 1) * math.prod(out_shape) < 2**31
        keys = torch.sort((out_keys32 if fits32 else out_keys)[:num_out]).values
        out_coords = torch.empty((num_out, 4), dtype=torch.int32, device=dev)
        sub, num_groups = _groups(_launch.cdiv(num_out, block))
    index = (bits[:words], prefix) if index_out else ()
    if scatter:
        consts = plan["scatter_consts"]
        _launch.launch(
            _kmap_scatter_kernel,
            (_launch.cdiv(n, consts["BLOCK_N"]),),  # launch 5 (of 5)
            coords,
            ws,
            bits,
            prefix,
            keys,
            out_coords,
            out_in,
            n,
            batch_size,
            *plan["in_shape"],
            cap_in,
            log_in,
            counters_off,
            num_out,
            *plan["out_shape"],
            **consts,
            ROW_BASE=_ROW_BASE,
            TAIL=1024,
            num_warps=_NUM_WARPS,
        )
    else:
        if out_in is None:
            out_in = torch.empty((num_out, num_k), dtype=torch.int32, device=dev)
        if mirror:  # rows of K // 2 + 1 offsets (padded), twice as many per program
            block, kpad = plan["block_half"], plan["kpad_half"]
        lookup_args = (
            coords,
            ws,
            keys,
            out_coords,
            out_in,
            *(in_index if idx else (coords, coords, 0, 0)),
            num_out,
            counts_off,
            counters_off,
            sub,
            *plan["in_shape"],
            cap_in,
            log_in,
            *plan["out_shape"],
        )
        lookup_meta = dict(
            **plan["lookup_consts"],
            ROW_BASE=_ROW_BASE,
            DEV_M=static_out,
            BLOCK_M=block,
            KPAD=kpad,
            TAIL=1024,
            HALF=mirror,
            COUNT=pairs,
            CSTRIDE=_COUNTER_STRIDE,
            IDX=idx,
            num_warps=_NUM_WARPS,
        )
        _launch.launch(_kmap_lookup_kernel, (_launch.cdiv(num_out, block),), *lookup_args, **lookup_meta)  # launch 3
        if record is not None:
            record.append((_kmap_lookup_kernel, (_launch.cdiv(num_out, block),), lookup_args, lookup_meta))
    sizes = None
    if record is not None and subm:
        sizes = (cap_in, log_in, sub, num_groups, counts_off, counters_off, sink_off, ws_len)
    elif record is not None:  # the layout (from N) and what the sync read (M, P, the key width)
        sizes = (cap_in, log_in, cap_out, log_out, counts_off, counters_off, sink_off, ws_len, num_out, num_pairs,
                 int(fits32), sub, num_groups)  # fmt: skip
    if not pairs:  # the table only: no compaction, no pair count to read
        empty = out_in.new_empty((0,))
        count = (ws[counters_off : counters_off + 1] + 1).to(torch.int32) if static_out else empty.clone()
        return (out_coords, empty, empty.clone(), count, out_in) + index
    if static_out:
        cap_pairs = bound  # one pair per valid (input, offset)
    else:
        cap_pairs = num_out * num_k if (subm or pad_pairs) else num_pairs
    pair_in, pair_out, offsets = _compact(
        out_in, ws, counts_off, sub, num_groups, block, kpad, cap_pairs, pad_pairs, counters_off if static_out else None,
        record,
    )  # launch 4  # fmt: skip
    if record is not None:
        _native_register(coords, plan, pairs, pad_pairs, sizes, record)
    if subm and not pad_pairs:
        num_pairs = int(
            offsets[num_k : num_k + 1].cpu()[0]
        )  # host sync: the pair count is an output size (all work is queued)
        pair_in, pair_out = pair_in[:num_pairs], pair_out[:num_pairs]
    return (out_coords, pair_in, pair_out, offsets, out_in) + index


_NATIVE_DONE: set = set()  # (plan, device, pairs, pad_pairs, ROWS, argument classes): registered or not registrable
_KINDS = {_kmap_insert_kernel: "p" * 7 + "i" * 15, _kmap_lookup_kernel: "p" * 7 + "i" * 14,
          _kmap_compact_kernel: "p" * 5 + "i" * 7}  # fmt: skip


def native_plan(plan: dict) -> tuple[tuple, tuple]:
    """A plan as ``csrc/host/kernel_map.cpp`` takes it: ``((D, H, W, Kz, Ky, Kx, sz, sy, sx, pz, py, px,
    dz, dy, dx, transposed | 2 subm), (K, BLOCK_M, KPAD, BLOCK_M half, KPAD half, insert lanes, sink, mirror,
    outputs per input J, D', H', W'))``."""
    ic, lc = plan["insert_consts"], plan["lookup_consts"]
    geometry = (*plan["in_shape"], ic["Kz"], ic["Ky"], ic["Kx"], *(lc[a + c] for a in "spd" for c in "zyx"),
                int(ic["TRANSPOSED"]) | (2 if plan["per_input"] == 0 else 0))  # fmt: skip
    values = (plan["num_k"], plan["block"], plan["kpad"], plan["block_half"], plan["kpad_half"], plan["block_n"],
              plan["sink"], int(plan["mirror"]), plan["per_input"], *plan["out_shape"])  # fmt: skip
    return geometry, values


def _native_register(coords, plan, pairs, pad_pairs, sizes, record) -> None:
    """Hand the launches of this map (insert, lookup and, with pairs, compaction: a submanifold
    map, or a regular / transposed one of the default form) to the native host path
    (``pcops._native``; ``csrc/host/kernel_map.cpp`` derives the same sizes from N (and M, P after
    the regular map's sync) and passes the arguments in this order), once per configuration and
    argument classes. Starts the module's build on the first call."""
    from .. import _native

    host = _native.loaded()
    if host is None:
        return
    n = coords.shape[0]
    classes = tuple(_native.spec(v) for a in record for v in a[2] if type(v) is int)
    wide = len(sizes) > 10 and not sizes[10]  # a regular map's int64 sort keys
    done = (native_plan(plan), coords.device.index, pairs, pad_pairs, classes, record[-1][3].get("ROWS"), wide)
    if done in _NATIVE_DONE or not _native.registrable(coords) or n * plan["num_k"] >= 2**31:
        return
    _NATIVE_DONE.add(done)
    bound = [_native.bind(k, grid, args, meta, _KINDS[k]) for k, grid, args, meta in record]
    if any(b is None for b in bound):
        return
    geometry, plan_values = native_plan(plan)
    if host.km_register(
        coords, geometry, pairs, pad_pairs, plan_values, sizes, *bound[:2], bound[2] if pairs else None
    ):  # (the submanifold or the regular table, by the plan's outputs per input and the sizes)
        _native.registered("sparse_conv_kernel_map subm" if plan["per_input"] == 0 else "sparse_conv_kernel_map")
    else:
        logging.getLogger("pcops").warning(
            "pcops: the native host path derives other kernel-map sizes than the Python path (N=%d); "
            "this map configuration stays on the Python path",
            n,
        )


def subm_table_from_index(coords, in_shape, kernel_size, dilation, in_index) -> torch.Tensor:
    """A submanifold out-in table ``(N, K)`` int32 of ``coords``, the output rows of a static
    regular map, from that map's bitmap index ``(bits, prefix, rows, cells)``
    (``sparse_conv_kernel_map(index_out=True)``): one launch, no hash table. Equal to the
    submanifold map's table of ``coords``; rows with batch index −1 (padding) get −1."""
    dev = coords.device
    padding = tuple((k - 1) // 2 * d for k, d in zip(kernel_size, dilation))
    plan = _plan(tuple(in_shape), tuple(in_shape), tuple(kernel_size), (1, 1, 1), padding, tuple(dilation), True, False)
    n, num_k, block, kpad = coords.shape[0], plan["num_k"], plan["block"], plan["kpad"]
    out_in = torch.empty((n, num_k), dtype=torch.int32, device=dev)
    if n == 0:
        return out_in
    bits = in_index[0]
    _launch.launch(
        _kmap_lookup_kernel,
        (_launch.cdiv(n, block),),
        coords,
        bits,  # the workspace: unused (no table, no counts)
        coords,
        coords,
        out_in,
        *in_index,
        n,
        0,
        0,
        1,
        *plan["in_shape"],
        _MIN_CAPACITY,
        _MIN_CAPACITY.bit_length() - 1,
        *plan["out_shape"],
        **plan["lookup_consts"],
        ROW_BASE=_ROW_BASE,
        DEV_M=False,
        BLOCK_M=block,
        KPAD=kpad,
        TAIL=1024,
        HALF=False,
        COUNT=False,
        CSTRIDE=_COUNTER_STRIDE,
        IDX=True,
        num_warps=_NUM_WARPS,
    )
    return out_in

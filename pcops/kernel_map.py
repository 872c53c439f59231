"""Sparse 3D convolution's kernel maps (index generation).

Every voxel backbone (SECOND, PV-RCNN, CenterPoint) runs sparse 3D convolutions whose first
step is index generation: which input voxel feeds which output voxel through which kernel
offset (spconv: Yan et al., "SECOND", Sensors 2018; Graham et al., "Submanifold sparse
convolutional networks", CVPR 2018; torchsparse, MLSys 2022). ``sparse_conv_kernel_map``
builds that map, deterministically, in two layouts; ``pcops.sparse_conv3d`` applies a weight with it.

Call path: ``sparse_conv_kernel_map`` (checks, shapes) → ``torch.ops.pcops.sparse_conv_kernel_map``
→ the implementation ``backend`` resolves to (``pcops._backend``: the reference, sort +
searchsorted, on the CPU; Triton, a GPU hash table, on CUDA).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple, Optional, Sequence

import torch

from . import _backend, _checks, _library, _native
from .reference import kernel_map as _ref

__all__ = ["KernelMap", "sparse_conv_kernel_map"]

_MAP_BACKENDS = ("auto", "triton", "reference")


class KernelMap(NamedTuple):
    """A sparse-convolution kernel map (see ``sparse_conv_kernel_map``).

    Fields:
        out_coords: ``(M, 4)`` int32 ``(batch, z, y, x)`` output voxels.
        out_spatial_shape: ``(D', H', W')`` of the output grid (Python ints).
        pair_in, pair_out: ``(P,)`` int32 input and output rows of every (input, output)
            pair, grouped by kernel offset: offset ``k`` owns ``[offsets[k], offsets[k+1])``,
            and within an offset the pairs are in ascending ``pair_out``.
        offsets: ``(K+1,)`` int32, ``offsets[0] = 0``, ``offsets[K] = P``.
        out_in: ``(M, K)`` int32, the input row feeding output ``m`` through offset ``k``
            (−1 for none): the implicit-GEMM layout.
    """

    out_coords: torch.Tensor
    out_spatial_shape: tuple
    pair_in: torch.Tensor
    pair_out: torch.Tensor
    offsets: torch.Tensor
    out_in: torch.Tensor

    def inverse(self, coords: torch.Tensor, spatial_shape: Sequence[int], *, backend: str = "auto") -> "KernelMap":
        """The inverse map of a regular (strided) map, as spconv's ``SparseInverseConv3d``.

        ``coords`` are the ``(N, 4)`` input voxels this map was built from and
        ``spatial_shape`` their grid. The inverse map's outputs are exactly those voxels, in
        their order; input ``o`` (a row of ``self.out_coords``) feeds output ``i`` through
        offset ``k`` iff ``self`` had ``o`` receive ``i`` through ``k``, i.e.
        ``i = o * stride - padding + k * dilation`` with the same ``k`` (the weight layout of
        a transposed conv). Equals ``sparse_conv_kernel_map(self.out_coords, ...,
        transposed=True)`` restricted to the rows ``coords``. ``coords`` must have as many
        rows as the original input (not checked: that would need a host sync). ``backend`` as
        :func:`sparse_conv_kernel_map` (for the pairs layout; the table is plain torch).
        """
        _checks.check_tensor("coords", coords, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
        shape = _triple("spatial_shape", spatial_shape, min_value=1)
        _backend.resolve(backend, "kernel_map_pairs", self.out_in, supported=_MAP_BACKENDS)
        coords = coords.to(device=self.out_in.device, dtype=torch.int32).contiguous()
        inv = _inverse_table(self.out_in, coords.shape[0])
        pair_in, pair_out, offsets = _library.call(torch.ops.pcops.kernel_map_pairs.default, inv, backend)
        return KernelMap(coords.clone(), shape, pair_in, pair_out, offsets, inv)


def _inverse_table(out_in: torch.Tensor, num_in: int) -> torch.Tensor:
    """``pcops.reference.kernel_map.inverse_table``: one Triton launch on CUDA (the same table),
    the plain-torch scatter on the CPU and while ``torch.compile`` traces."""
    if out_in.is_cuda and not torch.compiler.is_compiling():
        from .triton.sparse_conv3d import inverse_table

        return inverse_table(out_in.contiguous(), num_in)
    return _ref.inverse_table(out_in, num_in)


def _triple(name: str, v, *, min_value: int) -> tuple[int, int, int]:
    """An int or a 3-sequence of ints, each ≥ ``min_value``."""
    if hasattr(v, "tolist") and not isinstance(v, numbers.Integral):  # a tensor or numpy array
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if len(v) != 3:
            raise ValueError(f"{name}: expected an int or 3 values (z, y, x), got {v!r}")
        return tuple(_checks.check_int(f"{name}[{i}]", _as_int(x), min_value=min_value) for i, x in enumerate(v))
    v = _checks.check_int(name, _as_int(v), min_value=min_value)
    return (v, v, v)


def _as_int(v):
    """numpy integers → int (bools and everything else are left to ``check_int`` to refuse)."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v


def _output_shape(in_shape, kernel, stride, padding, dilation, subm, transposed):
    if subm:
        return tuple(in_shape)
    out = []
    for n, k, s, p, d in zip(in_shape, kernel, stride, padding, dilation):
        if transposed:
            out.append((n - 1) * s - 2 * p + d * (k - 1) + 1)
        else:
            out.append((n + 2 * p - d * (k - 1) - 1) // s + 1)
    if min(out) < 1:
        raise ValueError(
            f"spatial_shape: {tuple(in_shape)} is too small for kernel_size={kernel}, stride={stride}, "
            f"padding={padding}, dilation={dilation} (output grid {tuple(out)})"
        )
    return tuple(out)


def sparse_conv_kernel_map(
    coords: torch.Tensor,
    spatial_shape: Sequence[int],
    kernel_size=3,
    stride=1,
    padding=0,
    dilation=1,
    subm: bool = False,
    transposed: bool = False,
    *,
    pad_pairs: bool = False,
    static_shapes: bool = False,
    batch_size: Optional[int] = None,
    pairs: bool = True,
    backend: str = "auto",
) -> KernelMap:
    """Kernel map of a sparse 3D convolution: which input voxel feeds which output voxel through
    which kernel offset (spconv / torchsparse index generation).

    Args:
        coords: ``(N, 4)`` int32 ``(batch, z, y, x)`` active input voxels (int64 accepted and
            converted), unique, ``0 <= z < D`` etc., ``batch >= 0``. Rows of −1 (all four: the
            padding of ``voxelize(pad_to_max=True)`` and of static maps' outputs) are padding:
            never an input, and a submanifold map gives them a row of −1 in ``out_in``.
        spatial_shape: ``(D, H, W)`` of the input grid.
        kernel_size, stride, padding, dilation: an int or a ``(z, y, x)`` 3-tuple;
            kernel/stride/dilation ≥ 1, padding ≥ 0.
        subm: submanifold conv (Graham et al.): output voxels = input voxels, same rows and
            order; needs stride 1; ``padding`` is ignored: the kernel is centred,
            ``i = o + (k - (kernel_size - 1) // 2) * dilation`` per axis.
        transposed: transposed conv (decoders), the adjoint of a regular conv with the same
            arguments: input ``i`` feeds output ``o = i * stride - padding + k * dilation``
            (``torch.nn.functional.conv_transpose3d``'s rule, output_padding 0); the output
            set is every such ``o`` inside the output grid, sorted like a regular conv's.
            spconv's inverse conv (outputs restricted to the fine voxels a strided conv came
            from, on their own grid, e.g. an even size that ``(D' - 1) s - 2p + d (K - 1) + 1``
            does not give back) is ``KernelMap.inverse`` of that strided map.
        pad_pairs: the fixed-capacity pairs layout, for CUDA-graph capture / ``torch.compile``
            with static shapes: ``pair_in`` and ``pair_out`` get ``M·K`` entries (a bound no map
            exceeds: one input per (output, offset), so it never overflows); the ``P =
            offsets[K]`` real pairs come first, exactly as in the default form, then −1. Saves
            the submanifold map's only host sync.
        static_shapes: every output size a function of ``N`` alone, and **no host sync** for
            any kind of map, so regular and transposed maps can be captured in a CUDA graph
            too. Submanifold: the same as ``pad_pairs``. Regular/transposed: ``out_coords`` and
            ``out_in`` get ``N·J`` rows (``J`` = the most outputs one input can reach: 8 for
            3×3×3 stride 2, ``K`` for transposed), the ``M`` real rows first, exactly as in the
            default form, then rows of −1; the pair arrays get ``N·J`` entries (one pair per
            valid (input, offset), so ``P ≤ N·J``), −1 past ``P = offsets[K]``. ``M`` is
            ``(out_coords[:, 0] >= 0).sum()``, on the device. Needs ``batch_size``.
        batch_size: with ``static_shapes`` for a regular/transposed map, the number of samples
            (batch indices ``0 … batch_size - 1``); the GPU marks outputs in a bitmap of that
            many output grids (``batch_size · D'H'W' < 2^31``). Like an out-of-grid voxel, an
            input of a later sample is an error on the CPU path and never an input on the GPU.
        pairs: ``False`` builds the out-in table only (what ``pcops.sparse_conv3d`` and the
            ``pcops.nn`` layers read): ``pair_in``, ``pair_out`` and ``offsets`` are ``None``,
            the GPU skips the compaction launch, and a submanifold map makes no host sync
            without ``pad_pairs`` (``KernelMap.inverse`` still builds its pairs).
        backend: ``"auto"`` (default: Triton on CUDA, the reference on the CPU), ``"triton"``
            (CUDA tensors only) or ``"reference"`` (plain torch, any device; it syncs and checks
            like the CPU path). There is no CUDA C++ implementation.

    Rules (per axis, ``k = (kz, ky, kx)`` with each index in ``[0, size)``):
        regular: output ``o`` receives input ``i`` through ``k`` iff ``i = o * stride -
        padding + k * dilation``; the output grid is ``(D + 2p - d (K - 1) - 1) // s + 1``
        (``F.conv3d``'s); the output set is every ``o`` in that grid with at least one input.
        transposed: output grid ``(D - 1) s - 2p + d (K - 1) + 1``. Batches never mix.

    Returns:
        ``KernelMap(out_coords, out_spatial_shape, pair_in, pair_out, offsets, out_in)``:
        ``out_coords (M, 4)`` int32 (regular/transposed: sorted lexicographically by
        ``(batch, z, y, x)``; submanifold: a copy of ``coords``); ``out_in (M, K)`` int32, −1 for
        no input; pairs ``pair_in, pair_out (P,)`` int32 grouped by offset through
        ``offsets (K+1,)`` int32, ascending ``pair_out`` within an offset. Kernel offset
        order ``k = (kz * Ky + ky) * Kx + kx``; weights ``(K, C_in, C_out)`` follow it.
        For valid input the result is the same on every device and every run (deterministic).

    Example:
        >>> coords = torch.tensor([[0, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.int32)
        >>> km = pcops.sparse_conv_kernel_map(coords, (1, 1, 2), kernel_size=(1, 1, 3), subm=True)
        >>> km.out_in  # offsets x - 1, x, x + 1
        tensor([[-1,  0,  1],
                [ 0,  1, -1]], dtype=torch.int32)

    Checks: the CPU path raises ``ValueError`` for voxels outside ``spatial_shape`` and for
    duplicate voxels. The CUDA path cannot check without a host sync and does not: an
    out-of-grid input is never found as an input (and generates no outputs); among duplicate
    voxels the lowest row is the one found as input (deterministic; a submanifold map still
    has one output row per input row).

    GPU (Triton): a hash table of the input voxels (open addressing, linear probing, int64
    linear keys claimed with ``atomic_cas``, rows merged with ``atomic_max`` so duplicates
    resolve deterministically), one lookup pass over (output, offset) writing ``out_in`` and
    per-offset hit counts per group of rows, and a stable compaction into pairs whose programs
    each reduce the (≤ 256) group counts themselves (no scan launch). Regular/transposed conv
    first dedupe candidate outputs in a second hash table (same launch as the input inserts,
    which also counts the pairs: one per valid (input, offset)) and sort the unique keys
    (one ``torch.sort``).

    Launches and host syncs (every output size needs its sync; nothing else syncs):

    - submanifold: 4 launches (fill, insert, lookup, compaction); **one** host sync, for the
      pair count ``P``, made after all four are queued (the pair arrays are then views of
      ``N·K``-long buffers); with ``pad_pairs=True`` **none**: the whole map can be captured
      in a CUDA graph.
    - regular/transposed: 4 launches + ``torch.sort``'s; exactly **one** host sync, for the
      output count ``M`` (``P`` and the largest batch index are read with it), after the
      insert pass. ``pad_pairs`` changes only the pair arrays' length; with
      ``static_shapes=True`` **none**: 6 launches (fill; insert, candidates clearing their bit
      in a bitmap of the output grids; a count and a ranking pass over the bitmap write the
      output keys in order and ``M``; lookup and compaction read ``M`` on the device), no sort.
      A static regular map with ``pairs=False`` takes 5: its table is filled from the input
      side (each input finds its own row once and writes it into the ≤ 8 outputs it reaches,
      their rows read from the ranked bitmap) instead of hash lookups of every (output, offset).

    Host path: on CUDA a submanifold map, or a regular / transposed one without ``static_shapes``,
    with pairs (``pairs=True``; the table-only form stays on this path for now) of int32 coords is taken by the native host path (``pcops._native``: the workspace, allocations,
    the same launches and syncs in C++, once its build is loaded and the configuration has run once,
    its native map checked against the Python path's): the same kernels with the same arguments, so
    the same map. (A regular map whose output count falls in a class not seen yet is built again by
    the Python path after the sync: the first calls of such a class cost one extra insert pass.)
    """
    compiling = torch.compiler.is_compiling()
    op = "sparse_conv_kernel_map subm" if subm is True else "sparse_conv_kernel_map"
    args = (coords, spatial_shape, kernel_size, stride, padding, dilation, subm, transposed, pad_pairs, static_shapes,
            pairs, backend)  # fmt: skip
    host = None if compiling else _native.serves(op)  # takes what it can (pcops._native)
    if host is not None:
        km = _native_map(host.km_forward(*args))
        if km is not None:
            return km
    out_shape, (out_coords, pair_in, pair_out, offsets, out_in) = _map_outputs(
        coords, spatial_shape, kernel_size, stride, padding, dilation, subm, transposed, pad_pairs, static_shapes,
        batch_size, pairs, backend, 0,
    )  # fmt: skip
    if not pairs:
        km = KernelMap(out_coords, out_shape, None, None, None, out_in)
    else:
        km = KernelMap(out_coords, out_shape, pair_in, pair_out, offsets, out_in)
    if not compiling:  # (after a registration of this call's class: pcops._native.check)
        _native.check(op, lambda: _native_map(_native.MODULE.km_forward(*args)), km)
    return km


def _native_map(got) -> Optional[KernelMap]:
    """The native host path's ``((tensors), out_spatial_shape)`` as a KernelMap (None stays None;
    it takes maps with pairs only)."""
    if got is None:
        return None
    maps, out_shape = got
    return KernelMap(maps[0], out_shape, *maps[1:])


def _map_outputs(
    coords, spatial_shape, kernel_size, stride, padding, dilation, subm, transposed, pad_pairs, static_shapes,
    batch_size, pairs, backend, max_outputs,
) -> tuple:  # fmt: skip
    """``sparse_conv_kernel_map``'s checks and op call: ``(out_spatial_shape, the op's five
    outputs)`` (``max_outputs``: the op's cut of a static regular/transposed map)."""
    _checks.check_tensor("coords", coords, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
    op_args = _checked_op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed)
    if not isinstance(pad_pairs, bool):
        raise TypeError(f"pad_pairs: expected a bool, got {type(pad_pairs).__name__}")
    if not isinstance(static_shapes, bool):
        raise TypeError(f"static_shapes: expected a bool, got {type(static_shapes).__name__}")
    if not isinstance(pairs, bool):
        raise TypeError(f"pairs: expected a bool, got {type(pairs).__name__}")
    if static_shapes and not subm:
        if batch_size is None:
            raise ValueError(
                "batch_size: static_shapes=True needs the number of samples for a regular or "
                "transposed map (the size of the output bitmap)"
            )
        batch_size = _checks.check_int("batch_size", batch_size, min_value=1)
    else:
        batch_size = 0
    _backend.resolve(backend, "sparse_conv_kernel_map", coords, supported=_MAP_BACKENDS)
    if coords.dtype != torch.int32:
        coords = coords.to(torch.int32)
    if not coords.is_contiguous():
        coords = coords.contiguous()
    outputs = _library.call(
        torch.ops.pcops.sparse_conv_kernel_map.default,
        coords,
        *op_args,
        subm,
        transposed,
        pad_pairs,
        static_shapes,
        batch_size,
        backend,
        pairs,
        max_outputs,
    )
    return tuple(op_args[1]), outputs


def _checked_op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed):
    """``_op_args``; with plain ints and bools the checks run once per configuration (cached:
    host time is most of the budget), except while dynamo traces (it traces past ``lru_cache``)."""
    if type(subm) is bool and type(transposed) is bool and not torch.compiler.is_compiling():
        key = (_plain(spatial_shape), _plain(kernel_size), _plain(stride), _plain(padding), _plain(dilation))
        if None not in key:
            return _op_args_cached(*key, subm, transposed)
    return _op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed)


def _plain(v):
    """``v`` as a hashable cache key when it is an int or a list/tuple of ints, else None."""
    if type(v) is int:
        return v
    if type(v) in (tuple, list) and all(type(x) is int for x in v):
        return tuple(v)
    return None


def _op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed):
    """Checked ``(in_shape, out_shape, kernel, stride, padding, dilation)`` lists for the op
    (submanifold: the centred padding)."""
    if isinstance(spatial_shape, numbers.Integral):
        raise TypeError(f"spatial_shape: expected a sequence (D, H, W), got {spatial_shape!r}")
    in_shape = _triple("spatial_shape", spatial_shape, min_value=1)
    kernel = _triple("kernel_size", kernel_size, min_value=1)
    stride_ = _triple("stride", stride, min_value=1)
    padding_ = _triple("padding", padding, min_value=0)
    dilation_ = _triple("dilation", dilation, min_value=1)
    if not isinstance(subm, bool):
        raise TypeError(f"subm: expected a bool, got {type(subm).__name__}")
    if not isinstance(transposed, bool):
        raise TypeError(f"transposed: expected a bool, got {type(transposed).__name__}")
    if subm and transposed:
        raise ValueError("transposed: a submanifold conv cannot be transposed (subm=True, transposed=True)")
    if subm and stride_ != (1, 1, 1):
        raise ValueError(f"stride: a submanifold conv needs stride 1, got {stride_}")
    out_shape = _output_shape(in_shape, kernel, stride_, padding_, dilation_, subm, transposed)
    if subm:  # centred kernel: i = o + (k - c) * d, i.e. the regular rule with padding c * d
        padding_ = tuple((k - 1) // 2 * d for k, d in zip(kernel, dilation_))
    return tuple(list(v) for v in (in_shape, out_shape, kernel, stride_, padding_, dilation_))


@functools.lru_cache(maxsize=512)
def _op_args_cached(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed):
    # errors are raised, never cached; the dispatcher hands the kernels copies of the lists
    return _op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, transposed)


# --- registration: kernel map (``backend`` picks the implementation, pcops._backend) ----------------


def _map_impl(op: str, backend: str, t: torch.Tensor) -> str:
    impl = _backend.resolve(backend, op, t, supported=_MAP_BACKENDS)  # "auto" on CUDA: Triton
    impl = "reference" if impl == "cpu" else impl
    _backend.log_kernel(op, impl)
    return impl


@_library.custom_op("pcops::sparse_conv_kernel_map", mutates_args=(), device_types=("cpu", "cuda"))
def _kernel_map(
    coords: torch.Tensor,
    in_shape: list[int],
    out_shape: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    subm: bool,
    transposed: bool,
    pad_pairs: bool = False,
    static_shapes: bool = False,
    batch_size: int = 0,
    backend: str = "auto",
    pairs: bool = True,
    max_outputs: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if _map_impl("sparse_conv_kernel_map", backend, coords) == "reference":
        impl = _ref
    else:
        from .triton import kernel_map as impl
    return impl.sparse_conv_kernel_map(
        coords,
        in_shape,
        out_shape,
        kernel_size,
        stride,
        padding,
        dilation,
        subm,
        transposed,
        pad_pairs,
        static_shapes,
        batch_size,
        pairs,
        max_outputs,
    )


@_kernel_map.register_fake
def _kernel_map_fake(
    coords,
    in_shape,
    out_shape,
    kernel_size,
    stride,
    padding,
    dilation,
    subm,
    transposed,
    pad_pairs=False,
    static_shapes=False,
    batch_size=0,
    backend="auto",
    pairs=True,
    max_outputs=0,
):
    torch._check(coords.dim() == 2 and coords.shape[1] == 4, lambda: "coords: expected shape (N, 4)")
    torch._check(coords.dtype == torch.int32, lambda: "coords: expected int32")
    ctx = torch.library.get_ctx()
    num_k = math.prod(kernel_size)
    static_out = static_shapes and not subm
    if static_out:
        num_out = num_pairs = coords.shape[0] * _ref.outputs_per_input(kernel_size, stride, dilation, transposed)
        if max_outputs > 0:
            num_out = torch.sym_min(num_out, max_outputs)
    else:
        num_out = coords.shape[0] if subm else ctx.new_dynamic_size()
        num_pairs = num_out * num_k if (pad_pairs or static_shapes or not pairs) else ctx.new_dynamic_size()
    if not pairs:
        num_pairs = 0
    return (
        coords.new_empty((num_out, 4)),
        coords.new_empty((num_pairs,)),
        coords.new_empty((num_pairs,)),
        coords.new_empty((num_k + 1 if pairs else (1 if static_out else 0),)),
        coords.new_empty((num_out, num_k)),
    )


@_library.custom_op("pcops::static_kernel_map", mutates_args=(), device_types=("cpu", "cuda"))
def _static_kernel_map(
    coords: torch.Tensor,
    in_bits: Optional[torch.Tensor],
    in_prefix: Optional[torch.Tensor],
    in_rows: int,
    in_shape: list[int],
    out_shape: list[int],
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    subm: bool,
    batch_size: int,
    max_outputs: int,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pcops.nn``'s static-form maps, tables only: ``(out_coords, count, out_in, bits, prefix)``.
    Submanifold: ``out_in (N, K)``, the rest empty. Regular: ``out_coords`` / ``out_in`` cut to
    ``max_outputs`` rows (``0``: ``N·J``), ``count`` ``(1,)`` the output count before the cut,
    and the outputs' bitmap index (``pcops.reference.kernel_map.bitmap_index``). ``in_bits`` /
    ``in_prefix`` (or None): the bitmap index of ``coords`` when ``coords`` are the first
    ``in_rows`` output rows of an earlier regular map of ``batch_size`` samples; the GPU path then
    reads it instead of building a hash table (same results)."""
    empty = coords.new_empty((0,))
    if _map_impl("static_kernel_map", backend, coords) == "reference":
        if subm:
            out_in = _ref.sparse_conv_kernel_map(coords, in_shape, out_shape, kernel_size, stride, padding,
                                                 dilation, True, False, pairs=False)[4]  # fmt: skip
            return coords.new_empty((0, 4)), empty, out_in, empty.clone(), empty.clone()
        out_coords, _, _, count, out_in = _ref.sparse_conv_kernel_map(
            coords, in_shape, out_shape, kernel_size, stride, padding, dilation, False, False,
            static_shapes=True, batch_size=batch_size, pairs=False,
        )  # fmt: skip
        bits, prefix = _ref.bitmap_index(out_coords, batch_size, out_shape)
        rows = min(out_coords.shape[0], max_outputs) if max_outputs > 0 else out_coords.shape[0]
        return out_coords[:rows].clone(), count, out_in[:rows].clone(), bits, prefix
    from .triton import kernel_map as impl

    index = None
    if in_bits is not None and in_prefix is not None:
        index = (in_bits, in_prefix, in_rows, batch_size * math.prod(in_shape))
    if subm:
        if index is not None:
            out_in = impl.subm_table_from_index(coords, in_shape, kernel_size, dilation, index)
        else:
            out_in = impl.sparse_conv_kernel_map(coords, in_shape, out_shape, kernel_size, stride, padding,
                                                 dilation, True, False, pairs=False)[4]  # fmt: skip
        return coords.new_empty((0, 4)), empty, out_in, empty.clone(), empty.clone()
    out_coords, _, _, count, out_in, bits, prefix = impl.sparse_conv_kernel_map(
        coords, in_shape, out_shape, kernel_size, stride, padding, dilation, False, False,
        static_shapes=True, batch_size=batch_size, pairs=False, max_outputs=max_outputs, in_index=index,
        index_out=True,
    )  # fmt: skip
    return out_coords, count, out_in, bits, prefix


@_static_kernel_map.register_fake
def _static_kernel_map_fake(coords, in_bits, in_prefix, in_rows, in_shape, out_shape, kernel_size, stride, padding,
                            dilation, subm, batch_size, max_outputs, backend="auto"):  # fmt: skip
    num_k = math.prod(kernel_size)
    if subm:
        empty = [coords.new_empty((0,)) for _ in range(3)]
        return coords.new_empty((0, 4)), empty[0], coords.new_empty((coords.shape[0], num_k)), empty[1], empty[2]
    rows = coords.shape[0] * _ref.outputs_per_input(kernel_size, stride, dilation, False)
    if max_outputs > 0:
        rows = torch.sym_min(rows, max_outputs)
    words = -(-batch_size * math.prod(out_shape) // 32)
    return (
        coords.new_empty((rows, 4)),
        coords.new_empty((1,)),
        coords.new_empty((rows, num_k)),
        coords.new_empty((words,)),
        coords.new_empty((words,)),
    )


def _static_map(coords, spatial_shape, kernel_size, stride, padding, dilation, subm: bool, batch_size: int,
                max_outputs: int, index=None):  # fmt: skip
    """``pcops.nn``'s static map: ``(KernelMap without pairs, count or None, (bits, prefix) or
    None)``; ``index``: ``(bits, prefix, rows)`` of ``coords`` (see ``static_kernel_map``)."""
    op_args = _checked_op_args(spatial_shape, kernel_size, stride, padding, dilation, subm, False)
    bits, prefix, rows = index if index is not None else (None, None, 0)
    out_coords, count, out_in, out_bits, out_prefix = _library.call(
        torch.ops.pcops.static_kernel_map.default,
        coords,
        bits,
        prefix,
        rows,
        *op_args,
        subm,
        batch_size,
        max_outputs,
        "auto",
    )
    km = KernelMap(coords if subm else out_coords, tuple(op_args[1]), None, None, None, out_in)
    return km, (None if subm else count), (None if subm else (out_bits, out_prefix))


@_library.custom_op("pcops::kernel_map_pairs", mutates_args=(), device_types=("cpu", "cuda"))
def _kernel_map_pairs(out_in: torch.Tensor, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _map_impl("kernel_map_pairs", backend, out_in) == "reference":
        return _ref.pairs_from_table(out_in)
    from .triton import kernel_map as impl

    return impl.pairs_from_table(out_in.contiguous())


@_kernel_map_pairs.register_fake
def _kernel_map_pairs_fake(out_in, backend="auto"):
    torch._check(out_in.dim() == 2, lambda: "out_in: expected shape (M, K)")
    num_pairs = torch.library.get_ctx().new_dynamic_size()
    return out_in.new_empty((num_pairs,)), out_in.new_empty((num_pairs,)), out_in.new_empty((out_in.shape[1] + 1,))

"""Sparse convolution layers on pcops kernel maps, spconv 2 compatible.

``SparseConvTensor(features, indices, spatial_shape, batch_size)`` holds ``N`` active voxels:
``features (N, C)`` and ``indices (N, 4)`` int32 ``(batch, z, y, x)`` in a grid of
``spatial_shape = (D, H, W)``. The layers keep spconv 2's names, arguments and weight layout
``(C_out, kz, ky, kx, C_in)``, so a model ports by changing its imports:

- ``SubMConv3d``: submanifold (output voxels = input voxels, same rows and order),
- ``SparseConv3d``: regular (strided) convolution, outputs sorted by ``(batch, z, y, x)``,
- ``SparseInverseConv3d``: the inverse of the ``SparseConv3d`` that used the same ``indice_key``
  (its outputs are that conv's input voxels, in their order),
- ``SparseSequential`` (non-sparse modules such as ``nn.BatchNorm1d`` or ``nn.ReLU`` act on
  ``.features``), ``ToDense``.

Each conv also takes ``precision`` (keyword; the attribute of that name can be changed later):
how its GEMMs multiply float32 features, ``"auto"`` (TF32 where
``torch.backends.cuda.matmul.allow_tf32`` is set, else IEEE), ``"ieee"``, ``"tf32"`` or
``"tf32x3"`` (float32's accuracy on tensor cores); see ``pcops.sparse_conv3d``.

Kernel maps are built once per ``indice_key`` and kept in the tensor's ``indice_dict``, which
every output shares with its input: the SubM layers of one resolution reuse one map, and an
inverse conv finds the map of its strided conv (the layers build and use the maps' out-in
tables only, ``pairs=False``: a submanifold map makes no host sync, and an inverse conv takes the
inverse table without pairs; ``indice_dict[key].kernel_map`` has no pair arrays). In the static
form a strided conv's output voxels are the cleared bits of a bitmap of its output grid, in key
order; the output tensor carries that bitmap and a per-word prefix count, and the maps on those
voxels (the next SubM layers' and the next strided conv's) find a voxel's row from it in two
loads, with no hash table to build. The convolution is ``pcops.sparse_conv3d`` (implicit GEMM on the out-in table; deterministic forward
and backward, no atomics).

Indices: any row order is accepted. Duplicate voxels and voxels outside ``spatial_shape`` raise
``ValueError`` on the CPU; on CUDA they are not checked (that needs a host sync), see
``pcops.sparse_conv_kernel_map``.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple, Optional

import torch
from torch import nn

from .. import _checks, _library
from ..kernel_map import KernelMap, _inverse_table, _static_map, _triple, sparse_conv_kernel_map
from ..sparse_conv3d import check_precision

__all__ = [
    "SparseConvTensor",
    "SparseModule",
    "SubMConv3d",
    "SparseConv3d",
    "SparseInverseConv3d",
    "SparseSequential",
    "ToDense",
    "fuse_for_inference",
]


class _IndiceEntry(NamedTuple):
    """A kernel map kept under an ``indice_key``: its kind and geometry, its input voxels (an
    inverse conv's outputs) and, once built, the inverse conv's out-in table."""

    kind: str  # "subm" or "conv"
    geometry: tuple  # (kernel_size, stride, padding, dilation)
    kernel_map: KernelMap
    in_indices: torch.Tensor
    in_shape: tuple
    inverse: Optional[torch.Tensor]  # (N_in, K) int32: KernelMap.inverse's out_in, without its pairs
    out_in: torch.Tensor  # the layer's rows of kernel_map.out_in (fewer under a static capacity)
    out_coords: torch.Tensor  # and of kernel_map.out_coords


class _GridIndex(NamedTuple):
    """The bitmap index of a static strided conv's output voxels (``pcops.kernel_map.static_kernel_map``):
    later static maps on those voxels read it instead of building a hash table."""

    indices: torch.Tensor  # the voxels it indexes (the conv's output indices, this very tensor)
    bits: torch.Tensor
    prefix: torch.Tensor
    rows: int
    spatial_shape: tuple
    batch_size: int


class SparseConvTensor:
    """Active voxels of a sparse 3-D grid (spconv's ``SparseConvTensor``).

    Args:
        features: ``(N, C)`` float32/float16/bfloat16/float64, one row per voxel.
        indices: ``(N, 4)`` int32 (int64 accepted and converted) ``(batch, z, y, x)``.
        spatial_shape: ``(D, H, W)`` of the grid.
        batch_size: samples (batch indices ``0 … batch_size - 1``).
        indice_dict: kernel maps by ``indice_key`` (shared with the tensors a layer makes).
        static: fixed-capacity form, for CUDA-graph capture and ``torch.compile``: rows whose
            indices are −1 (all four, as ``voxelize(pad_to_max=True)`` pads) are padding, and
            every layer keeps shapes a function of the input's row count with no host sync
            (regular convs use ``static_shapes`` maps: ``N·J`` output rows, padding after the
            real ones; training-mode ``BatchNorm1d`` in ``SparseSequential`` uses the real rows
            only). Padding rows' features are unspecified (``valid`` says which rows are real).
            Each regular conv's capacity is ``J`` times its input's (8 for 3×3×3 stride 2), so a
            deep encoder's rows grow fast: correct, but slow for now.
    """

    def __init__(
        self,
        features,
        indices,
        spatial_shape,
        batch_size: int,
        indice_dict: Optional[dict] = None,
        *,
        static: bool = False,
        num_dropped: Optional[torch.Tensor] = None,
    ):
        _checks.check_tensor("features", features, dtypes=_checks.FLOAT_DTYPES, ndim=2)
        _checks.check_tensor("indices", indices, dtypes=_checks.INT_DTYPES, ndim=2, last_dim=4)
        _checks.check_same_device(features=features, indices=indices)
        if indices.shape[0] != features.shape[0]:
            raise ValueError(
                f"indices: expected {features.shape[0]} rows (one per feature row), got {indices.shape[0]}"
            )
        self.features = features
        self.indices = indices.to(torch.int32).contiguous()
        self.spatial_shape = list(_triple("spatial_shape", spatial_shape, min_value=1))
        self.batch_size = _checks.check_int("batch_size", batch_size, min_value=1)
        self.indice_dict = {} if indice_dict is None else indice_dict
        if not isinstance(static, bool):
            raise TypeError(f"static: expected a bool, got {type(static).__name__}")
        self.static = static
        # (1,) int64 on the device: voxels dropped by static capacities on the way here (None: none)
        self.num_dropped = num_dropped
        # static form: the bitmap index of `indices` when a strided conv made them (_GridIndex)
        self._grid: Optional[_GridIndex] = None

    @classmethod
    def _unchecked(cls, features, indices, spatial_shape, batch_size: int) -> "SparseConvTensor":
        """A variable-form tensor from parts a layer or model made itself (int32 contiguous
        indices, a list shape): the constructor's checks skipped (host time per call)."""
        t = cls.__new__(cls)
        t.features, t.indices, t.spatial_shape, t.batch_size = features, indices, list(spatial_shape), batch_size
        t.indice_dict, t.static, t.num_dropped, t._grid = {}, False, None, None
        return t

    def replace_feature(self, features: torch.Tensor) -> "SparseConvTensor":
        """The same voxels (and kernel maps) with new features of as many rows."""
        if not isinstance(features, torch.Tensor) or features.dim() != 2 or features.shape[0] != self.indices.shape[0]:
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
            raise ValueError(f"features: expected ({self.indices.shape[0]}, C), got {shape}")
        out = SparseConvTensor(
            features,
            self.indices,
            self.spatial_shape,
            self.batch_size,
            self.indice_dict,
            static=self.static,
            num_dropped=self.num_dropped,
        )
        out._grid = self._grid
        return out

    @property
    def valid(self) -> torch.Tensor:
        """``(N,)`` bool: the real rows (not padding)."""
        return self.indices[:, 0] >= 0

    @property
    def spatial_size(self) -> int:
        return math.prod(self.spatial_shape)

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """``(B, C, D, H, W)`` (``channels_first``) or ``(B, D, H, W, C)``, zeros where no voxel."""
        d, h, w = self.spatial_shape
        c = self.features.shape[1]
        cells = self.batch_size * d * h * w
        idx = self.indices.long()
        flat = ((idx[:, 0] * d + idx[:, 1]) * h + idx[:, 2]) * w + idx[:, 3]
        flat = torch.where(self.valid, flat, cells)  # padding rows go to a dropped extra cell (no sync)
        out = self.features.new_zeros((cells + 1, c))
        out[flat] = self.features
        out = out[:cells].view(self.batch_size, d, h, w, c)
        return out.permute(0, 4, 1, 2, 3).contiguous() if channels_first else out

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> "SparseConvTensor":
        """From ``(B, D, H, W, C)`` (spconv's channels-last convention): voxels with any non-zero channel."""
        _checks.check_tensor("x", x, dtypes=_checks.FLOAT_DTYPES, ndim=5)
        active = (x != 0).any(dim=-1)
        idx = active.nonzero()
        return cls(x[active], idx.to(torch.int32), x.shape[1:4], x.shape[0])

    def __repr__(self) -> str:
        return (
            f"SparseConvTensor(features={tuple(self.features.shape)}, spatial_shape={self.spatial_shape}, "
            f"batch_size={self.batch_size}, indice_keys={sorted(map(str, self.indice_dict))})"
        )


class SparseModule(nn.Module):
    """A module that takes and returns ``SparseConvTensor`` (``SparseSequential`` passes the
    tensor itself to these and only ``.features`` to other modules)."""


def _init_weight(weight: torch.Tensor, bias: Optional[torch.Tensor], fan_in: int) -> None:
    # as torch.nn.Conv3d: kaiming-uniform with a = sqrt(5), bias uniform in ±1/sqrt(fan_in)
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with torch.no_grad():
        weight.uniform_(-bound, bound)
        if bias is not None:
            bias.uniform_(-bound, bound)


class _SparseConv3d(SparseModule):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size=3,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        indice_key: Optional[str] = None,
        *,
        subm: bool = False,
        inverse: bool = False,
        capacity: Optional[int] = None,
        precision: str = "auto",
        algo=None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.precision = check_precision(precision)
        if capacity is not None:
            capacity = _checks.check_int("capacity", capacity, min_value=1)
        self.capacity = capacity
        self.in_channels = _checks.check_int("in_channels", in_channels, min_value=1)
        self.out_channels = _checks.check_int("out_channels", out_channels, min_value=1)
        if groups != 1:
            raise ValueError(f"groups: only groups=1 is supported, got {groups!r}")
        self.kernel_size = _triple("kernel_size", kernel_size, min_value=1)
        self.stride = _triple("stride", stride, min_value=1)
        self.padding = _triple("padding", padding, min_value=0)
        self.dilation = _triple("dilation", dilation, min_value=1)
        if subm and self.stride != (1, 1, 1):
            raise ValueError(f"stride: a submanifold conv needs stride 1, got {self.stride}")
        if indice_key is not None and not isinstance(indice_key, str):
            raise TypeError(f"indice_key: expected a str or None, got {type(indice_key).__name__}")
        if inverse and indice_key is None:
            raise ValueError("indice_key: SparseInverseConv3d needs the indice_key of the SparseConv3d it inverts")
        self.subm, self.inverse, self.indice_key, self.groups = subm, inverse, indice_key, 1
        self.activation: Optional[str] = None  # "relu": in the GEMM's epilogue (fuse_for_inference)
        self._gemm_cache = None  # (key, weight in the GEMM layout, bias) for inference calls
        kz, ky, kx = self.kernel_size
        factory = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty((out_channels, kz, ky, kx, in_channels), **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        _init_weight(self.weight, self.bias, in_channels * kz * ky * kx)

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}"
        if not self.subm and not self.inverse:
            s += f", stride={self.stride}, padding={self.padding}"
        if self.dilation != (1, 1, 1):
            s += f", dilation={self.dilation}"
        if self.bias is None:
            s += ", bias=False"
        s += f", indice_key={self.indice_key!r}" if self.indice_key else ""
        s += f", precision={self.precision!r}" if self.precision != "auto" else ""
        return s + (f", activation={self.activation!r}" if self.activation else "")

    def _geometry(self) -> tuple:
        padding = (0, 0, 0) if self.subm else self.padding  # a submanifold conv ignores padding
        return (self.kernel_size, self.stride, padding, self.dilation)

    def _map(self, x: SparseConvTensor):
        """(out-in table, output indices, output spatial shape, voxels dropped by the capacity or
        None, the output's bitmap index or None), from ``x.indice_dict`` where kept."""
        key, entry = self.indice_key, x.indice_dict.get(self.indice_key) if self.indice_key else None
        if self.inverse:
            if entry is None or entry.kind != "conv":
                raise ValueError(
                    f"indice_key: no SparseConv3d ran with indice_key={key!r} before this SparseInverseConv3d"
                )
            if entry.out_coords.shape[0] != x.indices.shape[0]:
                raise ValueError(
                    f"input: SparseInverseConv3d({key!r}) expects the {entry.out_coords.shape[0]} "
                    f"voxels its SparseConv3d produced, got {x.indices.shape[0]}"
                )
            if entry.geometry[0] != self.kernel_size:
                raise ValueError(
                    f"kernel_size: {self.kernel_size} differs from the SparseConv3d({key!r}) it inverts "
                    f"({entry.geometry[0]})"
                )
            if entry.inverse is None:  # the layer needs the table only: no pairs, no host sync
                entry = entry._replace(inverse=_inverse_table(entry.out_in, entry.in_indices.shape[0]))
                x.indice_dict[key] = entry
            return entry.inverse, entry.in_indices, list(entry.in_shape), None, None
        kind = "subm" if self.subm else "conv"
        if entry is not None and entry.kind == kind and entry.geometry == self._geometry():
            if entry.in_indices.shape[0] == x.indices.shape[0] and list(entry.in_shape) == x.spatial_shape:
                shape = list(entry.kernel_map.out_spatial_shape)
                return (
                    entry.out_in,
                    (x.indices if self.subm else entry.out_coords),
                    shape,
                    None,
                    (x._grid if self.subm else None),
                )
        if entry is not None and self.subm and entry.kind == "subm":
            raise ValueError(
                f"indice_key: {key!r} holds a submanifold map of another kernel or input "
                f"({entry.geometry[0]} on {entry.in_indices.shape[0]} voxels); use another key"
            )
        dropped, grid = None, None
        if x.static:
            # tables only, no sync; a strided conv keeps the first `capacity` rows (sorted) and
            # counts all. Voxels a static strided conv made come with their bitmap index, which
            # the maps on them read instead of hashing the voxels again
            g = x._grid
            index = None
            if g is not None and g.indices is x.indices and g.spatial_shape == tuple(x.spatial_shape):
                index = (g.bits, g.prefix, g.rows) if g.batch_size == x.batch_size else None
            geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
            km, count, out_index = _static_map(
                x.indices, x.spatial_shape, *geometry, self.subm, x.batch_size, self.capacity or 0, index
            )
            if count is not None and self.capacity is not None:
                dropped = (count.to(torch.int64) - self.capacity).clamp(min=0)
            if out_index is not None:
                shape = tuple(km.out_spatial_shape)
                grid = _GridIndex(km.out_coords, *out_index, km.out_coords.shape[0], shape, x.batch_size)
        else:
            km = sparse_conv_kernel_map(
                x.indices,
                x.spatial_shape,
                self.kernel_size,
                self.stride,
                self.padding,
                self.dilation,
                subm=self.subm,
                pairs=False,  # the GEMM reads the out-in table only: no compaction, no pair-count sync
            )
        out_in, out_coords = km.out_in, km.out_coords
        if key is not None:
            x.indice_dict[key] = _IndiceEntry(
                kind, self._geometry(), km, x.indices, tuple(x.spatial_shape), None, out_in, out_coords
            )
        grid = grid if grid is not None else (x._grid if self.subm else None)
        return out_in, (x.indices if self.subm else out_coords), list(km.out_spatial_shape), dropped, grid

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        if not isinstance(x, SparseConvTensor):
            raise TypeError(f"input: expected a pcops.nn.SparseConvTensor, got {type(x).__name__}")
        if x.features.shape[1] != self.in_channels:
            raise ValueError(
                f"input: {type(self).__name__} expects {self.in_channels} channels, got {x.features.shape[1]}"
            )
        out_in, out_indices, out_shape, dropped, grid = self._map(x)
        num_dropped = x.num_dropped
        if dropped is not None:
            num_dropped = dropped if num_dropped is None else num_dropped + dropped
        feats = x.features
        if self.weight.dtype != feats.dtype:
            if not torch.is_autocast_enabled(feats.device.type):
                raise TypeError(
                    f"input: features are {feats.dtype} but the weight is {self.weight.dtype}; convert one "
                    "(.to(dtype)) or run under torch.autocast"
                )
            feats = feats.to(torch.get_autocast_dtype(feats.device.type))
        w, bias = self._gemm_weight(feats.dtype)
        act = self.activation or "none"
        # a submanifold map with odd kernel sizes is its own inverse (offsets mirrored): the backward
        # runs the feature gradient on it instead of building the inverse table
        symmetric = self.subm and all(k % 2 for k in self.kernel_size)
        out = _library.call(
            torch.ops.pcops.sparse_conv3d.default,
            feats.contiguous(),
            w,
            bias,
            out_in,
            "auto",
            act,
            symmetric,
            self.precision,
        )
        y = SparseConvTensor(
            out, out_indices, out_shape, x.batch_size, x.indice_dict, static=x.static, num_dropped=num_dropped
        )
        y._grid = grid
        return y

    def _gemm_weight(self, dtype: torch.dtype) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The weight in the GEMM's ``(K, C_in, C_out)`` layout and the bias, both of ``dtype``.

        Where no gradient is recorded (inference), the relayout (one copy kernel per layer and
        call) and any autocast cast are kept and reused until the parameters change (their
        storage, version counter or dtype); training recomputes them, differentiably."""
        weight, bias = self.weight, self.bias
        cacheable = not (torch.is_grad_enabled() and weight.requires_grad) and not torch.compiler.is_compiling()
        if cacheable:
            key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, dtype)
            key += (None,) if bias is None else (bias.data_ptr(), bias._version)
            cached = self._gemm_cache
            if cached is not None and cached[0] == key:
                return cached[1], cached[2]
        k = math.prod(self.kernel_size)
        w = weight.to(dtype).permute(1, 2, 3, 4, 0).reshape(k, self.in_channels, self.out_channels).contiguous()
        b = bias.to(dtype) if bias is not None else None
        if cacheable:
            self._gemm_cache = (key, w, b)
        return w, b

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # spconv 1.x checkpoints (OpenPCDet's published SECOND ones) keep (kz, ky, kx, C_in, C_out)
        key = prefix + "weight"
        w = state_dict.get(key)
        if isinstance(w, torch.Tensor) and w.dim() == 5 and tuple(w.shape) != tuple(self.weight.shape):
            kz, ky, kx = self.kernel_size
            if tuple(w.shape) == (kz, ky, kx, self.in_channels, self.out_channels):
                state_dict[key] = w.permute(4, 0, 1, 2, 3).contiguous()
            else:
                raise ValueError(
                    f"{key}: expected spconv 2's (C_out, kz, ky, kx, C_in) = {tuple(self.weight.shape)} or spconv "
                    f"1's (kz, ky, kx, C_in, C_out) = {(kz, ky, kx, self.in_channels, self.out_channels)}, "
                    f"got {tuple(w.shape)}"
                )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class SubMConv3d(_SparseConv3d):
    """Submanifold sparse convolution (Graham et al., CVPR 2018): outputs at the input voxels only.

    spconv 2's ``SubMConv3d(in_channels, out_channels, kernel_size, stride=1, padding=0,
    dilation=1, groups=1, bias=True, indice_key=None)``; ``padding`` is ignored (the kernel is
    centred). Layers with one ``indice_key`` share one kernel map.

    Example:
        >>> x = pcops.nn.SparseConvTensor(feats, coords, (41, 1600, 1408), batch_size=1)
        >>> y = pcops.nn.SubMConv3d(4, 16, 3, indice_key="subm1")(x)  # y.indices is x.indices
    """

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, indice_key=None, algo=None, *, precision="auto", device=None, dtype=None):  # fmt: skip
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         indice_key, subm=True, precision=precision, algo=algo, device=device, dtype=dtype)  # fmt: skip


class SparseConv3d(_SparseConv3d):
    """Regular sparse convolution: an output voxel wherever the kernel reaches an input voxel
    (``F.conv3d``'s output grid and rule), outputs sorted by ``(batch, z, y, x)``.

    spconv 2's ``SparseConv3d(in_channels, out_channels, kernel_size, stride=1, padding=0,
    dilation=1, groups=1, bias=True, indice_key=None)``; give an ``indice_key`` for a later
    ``SparseInverseConv3d`` to invert it. ``capacity`` (static form only): keep at most this many
    output rows, the first in ``(batch, z, y, x)`` order; the voxels past it are dropped and
    counted in the output's ``num_dropped`` (a device tensor, no sync). Default: the exact bound
    ``N·J`` (``J`` = 8 for 3×3×3 stride 2), which multiplies through a deep encoder.
    """

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, indice_key=None, algo=None, *, capacity=None, precision="auto", device=None,
                 dtype=None):  # fmt: skip
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         indice_key, capacity=capacity, precision=precision, algo=algo, device=device,
                         dtype=dtype)  # fmt: skip


class SparseInverseConv3d(_SparseConv3d):
    """The inverse of the ``SparseConv3d`` that ran with ``indice_key``: its outputs are that
    conv's input voxels (rows and order), reached through the same pairs with the same kernel
    offsets (``KernelMap.inverse``), as spconv's ``SparseInverseConv3d(in_channels,
    out_channels, kernel_size, indice_key, bias=True)``."""

    def __init__(self, in_channels, out_channels, kernel_size, indice_key=None, bias=True, algo=None, *,
                 precision="auto", device=None, dtype=None):  # fmt: skip
        super().__init__(in_channels, out_channels, kernel_size, 1, 0, 1, 1, bias, indice_key, inverse=True,
                         precision=precision, algo=algo, device=device, dtype=dtype)  # fmt: skip


class SparseSequential(nn.Sequential):
    """``nn.Sequential`` for sparse tensors: ``SparseModule``s get the ``SparseConvTensor``, other
    modules (``nn.BatchNorm1d``, ``nn.ReLU``, ...) its ``.features`` (spconv's rule)."""

    def forward(self, x):
        for module in self:
            if isinstance(module, nn.Identity):  # e.g. a BatchNorm or ReLU fused into its conv
                continue
            if isinstance(module, (SparseModule, SparseSequential)) or not isinstance(x, SparseConvTensor):
                x = module(x)
            elif x.static and isinstance(module, nn.BatchNorm1d) and module.training:
                x = x.replace_feature(_masked_batch_norm(module, x.features, x.valid))
            else:
                x = x.replace_feature(module(x.features))
        return x


def _masked_batch_norm(bn: nn.BatchNorm1d, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Training-mode ``bn(x)`` with the statistics (and the running-statistics update) of the
    ``valid`` rows only (``pcops.masked_batch_norm``: Triton on CUDA), no host sync; every row is
    normalised."""
    y, mean, var, n = _library.call(
        torch.ops.pcops.masked_batch_norm.default, x.contiguous(), valid, bn.weight, bn.bias, float(bn.eps), "auto"
    )
    if bn.track_running_stats:
        with torch.no_grad():
            bn.num_batches_tracked += 1
            m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
            bn.running_mean.mul_(1 - m).add_(mean.to(bn.running_mean.dtype), alpha=m)
            unbiased = var * n / (n - 1).clamp(min=1)
            bn.running_var.mul_(1 - m).add_(unbiased.to(bn.running_var.dtype), alpha=m)
    return y


def fuse_for_inference(module: nn.Module) -> nn.Module:
    """A copy of ``module`` for inference in which every sparse conv followed by an
    ``nn.BatchNorm1d`` (and an ``nn.ReLU``) in a ``SparseSequential`` runs as one convolution.

    The BatchNorm's running statistics and affine parameters are folded into the conv's weight and
    bias (``W' = W·s``, ``b' = (b − μ)·s + β`` with ``s = γ / sqrt(σ² + ε)``, computed in float64),
    the ReLU becomes the GEMM's epilogue (``activation="relu"``), and the fused BatchNorm and ReLU
    are replaced by ``nn.Identity`` (so module indices stay the same). Per fused triple that saves
    two elementwise passes over the features and their launches. Outputs equal the unfused
    module's to float rounding; the input module is not changed.

    Raises ``ValueError`` when ``module`` is in training mode (BatchNorm then uses batch
    statistics, which cannot be folded)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module: expected an nn.Module, got {type(module).__name__}")
    if module.training:
        raise ValueError(
            "module: expected a module in eval mode (call .eval() first): training BatchNorm cannot be folded"
        )
    fused = copy.deepcopy(module)
    for seq in fused.modules():
        if not isinstance(seq, SparseSequential):
            continue
        names = list(seq._modules)
        for i, name in enumerate(names[:-1]):
            conv, bn = seq._modules[name], seq._modules[names[i + 1]]
            if not (isinstance(conv, _SparseConv3d) and conv.activation is None and _foldable(bn)):
                continue
            _fold(conv, bn)
            seq._modules[names[i + 1]] = nn.Identity()
            if i + 2 < len(names) and type(seq._modules[names[i + 2]]) is nn.ReLU:
                conv.activation = "relu"
                seq._modules[names[i + 2]] = nn.Identity()
    return fused


def _foldable(bn) -> bool:
    return (
        type(bn) is nn.BatchNorm1d
        and not bn.training
        and bn.track_running_stats
        and bn.running_mean is not None
        and bn.running_var is not None
    )


@torch.no_grad()
def _fold(conv: _SparseConv3d, bn: nn.BatchNorm1d) -> None:
    scale = torch.rsqrt(bn.running_var.double() + bn.eps)
    if bn.affine:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.affine:
        shift = shift + bn.bias.double()
    if conv.bias is not None:
        shift = shift + conv.bias.double() * scale
    w = conv.weight
    conv.weight = nn.Parameter((w.double() * scale.view(-1, 1, 1, 1, 1)).to(w.dtype), requires_grad=w.requires_grad)
    conv.bias = nn.Parameter(shift.to(w.dtype), requires_grad=w.requires_grad)


class ToDense(SparseModule):
    """``SparseConvTensor`` → dense ``(B, C, D, H, W)``."""

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        if not isinstance(x, SparseConvTensor):
            raise TypeError(f"input: expected a pcops.nn.SparseConvTensor, got {type(x).__name__}")
        return x.dense()

"""SECOND's voxel feature encoder and sparse middle encoder (Yan et al., "SECOND", Sensors 2018)
on ``pcops.nn``, with OpenPCDet's module names so its checkpoints load as they are.

``MeanVFE`` (the mean of each voxel's points) and ``VoxelBackBone8x`` (OpenPCDet's
``backbones_3d/spconv_backbone.py`` layout: 4 → 16 subm ×2, s2 → 32, subm ×2, s2 → 64, subm ×2,
s2 → 64, subm ×2, (3, 1, 1) s(2, 1, 1) → 128; BatchNorm1d(eps 1e-3, momentum 0.01) + ReLU after
every conv). Weights in spconv 2's ``(C_out, kz, ky, kx, C_in)`` layout or spconv 1.x's
``(kz, ky, kx, C_in, C_out)`` (OpenPCDet's published SECOND checkpoints) both load: the sparse
layers convert the latter on load and raise ``ValueError`` for any other shape.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from pcops import nn as pnn

__all__ = ["mean_vfe", "VoxelBackBone8x"]


def mean_vfe(voxels: torch.Tensor, num_points: torch.Tensor) -> torch.Tensor:
    """OpenPCDet's ``MeanVFE``: ``(M, T, C)`` voxels (zero padded) and ``(M,)`` point counts →
    ``(M, C)`` means (empty voxels give zeros)."""
    if voxels.dim() != 3 or num_points.shape != voxels.shape[:1]:
        raise ValueError(f"voxels, num_points: expected (M, T, C) and (M,), got {tuple(voxels.shape)}, "
                         f"{tuple(num_points.shape)}")  # fmt: skip
    return voxels.sum(dim=1) / num_points.clamp(min=1).to(voxels.dtype)[:, None]


def _block(c_in, c_out, kernel, *, stride=1, padding=0, indice_key=None, conv="subm", capacity=None):
    """OpenPCDet's ``post_act_block``: sparse conv (no bias), BatchNorm1d, ReLU."""
    if conv == "subm":
        layer = pnn.SubMConv3d(c_in, c_out, kernel, bias=False, indice_key=indice_key)
    else:
        layer = pnn.SparseConv3d(
            c_in, c_out, kernel, stride, padding, bias=False, indice_key=indice_key, capacity=capacity
        )
    return pnn.SparseSequential(layer, nn.BatchNorm1d(c_out, eps=1e-3, momentum=0.01), nn.ReLU())


class VoxelBackBone8x(nn.Module):
    """SECOND's sparse middle encoder (OpenPCDet ``VoxelBackBone8x``), 8× down in x and y.

    Args:
        input_channels: voxel feature channels (4 for KITTI x, y, z, r means).
        grid_size: ``(nx, ny, nz)`` voxels of the point-cloud range (OpenPCDet's order, e.g.
            ``(1408, 1600, 40)`` for KITTI's SECOND grid); the sparse grid is
            ``(nz + 1, ny, nx)``, as OpenPCDet's.
        static_capacity: in the static form (``SparseConvTensor(static=True)``), the most rows
            each strided conv keeps (e.g. the voxelizer's ``max_voxels``); voxels past it are
            counted in the output's ``num_dropped``. ``None``: the exact bound, which grows 8×
            per strided conv.

    ``forward(x)`` takes a ``pcops.nn.SparseConvTensor`` of the voxels (``indices`` ``(b, z, y,
    x)``) and returns ``{"encoded_spconv_tensor": (128 channels, grid / (8, 8, 16)),
    "encoded_spconv_tensor_stride": 8, "multi_scale_3d_features": {"x_conv1": …, "x_conv4": …}}``;
    ``forward_voxels(features, coords, batch_size)`` builds the tensor first. ``to_bev(out)``
    flattens the encoded tensor to the ``(B, 128 · D, H, W)`` map of OpenPCDet's
    ``HeightCompression``.
    """

    def __init__(self, input_channels: int = 4, grid_size: Sequence[int] = (1408, 1600, 40), *, static_capacity=None):
        super().__init__()
        cap = static_capacity
        nx, ny, nz = (int(v) for v in grid_size)
        self.sparse_shape = [nz + 1, ny, nx]
        self.conv_input = pnn.SparseSequential(
            pnn.SubMConv3d(input_channels, 16, 3, padding=1, bias=False, indice_key="subm1"),
            nn.BatchNorm1d(16, eps=1e-3, momentum=0.01),
            nn.ReLU(),
        )
        self.conv1 = pnn.SparseSequential(_block(16, 16, 3, padding=1, indice_key="subm1"))
        self.conv2 = pnn.SparseSequential(
            _block(16, 32, 3, stride=2, padding=1, indice_key="spconv2", conv="spconv", capacity=cap),
            _block(32, 32, 3, padding=1, indice_key="subm2"),
            _block(32, 32, 3, padding=1, indice_key="subm2"),
        )
        self.conv3 = pnn.SparseSequential(
            _block(32, 64, 3, stride=2, padding=1, indice_key="spconv3", conv="spconv", capacity=cap),
            _block(64, 64, 3, padding=1, indice_key="subm3"),
            _block(64, 64, 3, padding=1, indice_key="subm3"),
        )
        self.conv4 = pnn.SparseSequential(
            _block(64, 64, 3, stride=2, padding=(0, 1, 1), indice_key="spconv4", conv="spconv", capacity=cap),
            _block(64, 64, 3, padding=1, indice_key="subm4"),
            _block(64, 64, 3, padding=1, indice_key="subm4"),
        )
        self.conv_out = pnn.SparseSequential(
            pnn.SparseConv3d(
                64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2", capacity=cap
            ),
            nn.BatchNorm1d(128, eps=1e-3, momentum=0.01),
            nn.ReLU(),
        )
        self.num_point_features = 128

    def forward(self, x: pnn.SparseConvTensor) -> dict:
        if list(x.spatial_shape) != self.sparse_shape:
            raise ValueError(f"x: expected spatial_shape {self.sparse_shape} (grid_size), got {x.spatial_shape}")
        x1 = self.conv1(self.conv_input(x))
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        x4 = self.conv4(x3)
        out = self.conv_out(x4)
        return {
            "encoded_spconv_tensor": out,
            "encoded_spconv_tensor_stride": 8,
            "multi_scale_3d_features": {"x_conv1": x1, "x_conv2": x2, "x_conv3": x3, "x_conv4": x4},
        }

    def forward_voxels(self, features: torch.Tensor, coords: torch.Tensor, batch_size: int) -> dict:
        """``features (M, C)`` (e.g. ``mean_vfe``), ``coords (M, 4)`` ``(b, z, y, x)``."""
        return self(pnn.SparseConvTensor(features, coords, self.sparse_shape, batch_size))

    @staticmethod
    def to_bev(encoded: pnn.SparseConvTensor) -> torch.Tensor:
        """OpenPCDet's ``HeightCompression``: ``(B, C, D, H, W)`` → ``(B, C · D, H, W)``."""
        dense = encoded.dense()
        b, c, d, h, w = dense.shape
        return dense.view(b, c * d, h, w)

    def load_openpcdet(self, state_dict: dict, prefix: str = "backbone_3d.") -> None:
        """Load an OpenPCDet SECOND checkpoint's middle encoder (its ``model_state`` or a whole
        checkpoint dict; keys under ``prefix``), spconv 1.x or 2.x weight layout."""
        state = state_dict.get("model_state", state_dict)
        sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if not sub:
            raise ValueError(f"state_dict: no keys start with {prefix!r} (is it an OpenPCDet SECOND checkpoint?)")
        self.load_state_dict(sub)

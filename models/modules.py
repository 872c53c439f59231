"""OpenPCDet's PointPillars modules, with its names and structure (so checkpoints load as they are).

``PillarVFE`` → ``PointPillarScatter`` → ``BaseBEVBackbone`` → ``AnchorHeadSingle``; see
``models/pointpillars.py`` for the matches with OpenPCDet checked against its source.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import pcops

from .config import PointPillarsConfig

__all__ = ["PFNLayer", "PillarVFE", "BaseBEVBackbone", "AnchorHeadSingle", "PointPillarScatter"]


class PFNLayer(nn.Module):
    """One pillar-feature-net layer: Linear (no bias) → BatchNorm1d → ReLU → max over points."""

    def __init__(self, in_channels: int, out_channels: int, last_layer: bool, eps: float, momentum: float):
        super().__init__()
        self.last_vfe = last_layer
        if not last_layer:
            out_channels //= 2
        self.linear = nn.Linear(in_channels, out_channels, bias=False)
        self.norm = nn.BatchNorm1d(out_channels, eps=eps, momentum=momentum)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (P, T, C_in) -> (P, 1, C) or (P, T, 2C)
        x = self.linear(x)
        x = self.norm(x.permute(0, 2, 1)).permute(0, 2, 1)
        x = F.relu(x)
        x_max = torch.max(x, dim=1, keepdim=True)[0]
        if self.last_vfe:
            return x_max
        return torch.cat([x, x_max.expand(-1, x.shape[1], -1)], dim=2)


class PillarVFE(nn.Module):
    """OpenPCDet's ``PillarVFE``: point decoration and the PFN layers, ``(P, T, F)`` → ``(P, C)``."""

    def __init__(self, config: PointPillarsConfig):
        super().__init__()
        self.config = config
        filters = [config.num_pfn_inputs, *config.vfe_filters]
        self.pfn_layers = nn.ModuleList(
            PFNLayer(filters[i], filters[i + 1], i >= len(filters) - 2, config.bn_eps, config.bn_momentum)
            for i in range(len(filters) - 1)
        )

    def decorate(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        """``(P, T, F)`` point slots → ``(P, T, num_pfn_inputs)`` decorated and masked features."""
        cfg = self.config
        vx, vy, vz = cfg.voxel_size
        x_off, y_off, z_off = (v / 2 + lo for v, lo in zip(cfg.voxel_size, cfg.point_cloud_range[:3]))
        voxels = voxels[..., : cfg.num_point_features]
        xyz = voxels[:, :, :3]
        # clamp: fixed-capacity padding rows have no points (their features are masked to 0 below)
        points_mean = xyz.sum(dim=1, keepdim=True) / num_points.clamp(min=1).type_as(voxels).view(-1, 1, 1)
        f_cluster = xyz - points_mean
        f_center = torch.zeros_like(xyz)
        f_center[:, :, 0] = voxels[:, :, 0] - (coords[:, 3].to(voxels.dtype).unsqueeze(1) * vx + x_off)
        f_center[:, :, 1] = voxels[:, :, 1] - (coords[:, 2].to(voxels.dtype).unsqueeze(1) * vy + y_off)
        f_center[:, :, 2] = voxels[:, :, 2] - (coords[:, 1].to(voxels.dtype).unsqueeze(1) * vz + z_off)
        feats = [voxels if cfg.use_absolute_xyz else voxels[..., 3:], f_cluster, f_center]
        if cfg.with_distance:
            feats.append(torch.norm(xyz, 2, dim=2, keepdim=True))
        features = torch.cat(feats, dim=-1)
        # get_paddings_indicator: slot t of a pillar is real when t < num_points
        mask = torch.arange(features.shape[1], device=features.device).view(1, -1) < num_points.view(-1, 1)
        return features * mask.unsqueeze(-1).type_as(features)

    def forward(self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        features = self.decorate(voxels, num_points, coords)
        for pfn in self.pfn_layers:
            features = pfn(features)
        return features.squeeze(1)  # OpenPCDet's .squeeze() without the P == 1 pitfall

    def forward_train(
        self, voxels: torch.Tensor, num_points: torch.Tensor, coords: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Training forward on fixed-capacity pillars: ``(P, T, F)`` → ``(P, C)`` float32.

        BatchNorm uses the statistics of the ``valid (P,)`` rows only (padding rows excluded; within a
        real pillar the zero padding slots count, as in OpenPCDet) and updates the running statistics.
        For the single-layer PFN the statistics come from the 10-channel input moments
        (``mean = W μ``, ``var = diag(W Σ Wᵀ)``: exact, and no (P, T, 64) pass is needed for them), the
        normalisation is folded into the linear layer, and ``relu(max_t z) = max_t relu(z)`` saves a pass.
        When the BatchNorms are ``SyncBatchNorm`` (``--sync-bn``) under a process group, the count and
        the moments are all-reduced (autograd-aware) before use: the statistics of the global batch.
        """
        from .distributed import all_reduce_sum, sync_group

        x = self.decorate(voxels, num_points, coords).float()
        w_valid = valid.to(x.dtype).view(-1, 1, 1)
        group = sync_group(self.pfn_layers[0].norm)  # SyncBatchNorm under DDP: moments over all ranks
        red = (lambda t: t) if group is None else (lambda t: all_reduce_sum(t, group))
        n = red(valid.sum() * x.shape[1]).clamp(min=2).to(x.dtype)
        for i, pfn in enumerate(self.pfn_layers):
            bn = pfn.norm
            weight = pfn.linear.weight.float()
            if pfn.last_vfe:
                xv = x * w_valid
                mu_x = red(xv.sum(dim=(0, 1))) / n
                xc = (x - mu_x) * w_valid
                # per pillar, then summed: one (P*T)-long float32 dot product per entry accumulates
                # sequentially on the CPU and loses ~3 digits (benchmarks/NOTES.md, stop 26)
                cov = red(torch.einsum("pti,ptj->pij", xc, xc).sum(dim=0)) / n
                mean = weight @ mu_x
                var = ((weight @ cov) * weight).sum(dim=1).clamp(min=0)
            else:
                z = F.linear(x, weight)
                mean = red((z * w_valid).sum(dim=(0, 1))) / n
                var = red((((z - mean) * w_valid) ** 2).sum(dim=(0, 1))) / n
            with torch.no_grad():
                bn.num_batches_tracked += 1
                # momentum None: cumulative average, as torch's BatchNorm
                f = bn.momentum if bn.momentum is not None else 1.0 / bn.num_batches_tracked.item()
                bn.running_mean.mul_(1 - f).add_(mean.detach(), alpha=f)
                bn.running_var.mul_(1 - f).add_(var.detach() * n / (n - 1), alpha=f)
            scale = bn.weight.float() / torch.sqrt(var + bn.eps)
            shift = bn.bias.float() - mean * scale
            if pfn.last_vfe:
                x = torch.relu(F.linear(x, weight * scale.unsqueeze(1)).amax(dim=1) + shift)
            else:
                y = torch.relu(z * scale + shift)
                x = torch.cat([y, y.amax(dim=1, keepdim=True).expand_as(y)], dim=2)
        return x


class BaseBEVBackbone(nn.Module):
    """OpenPCDet's ``BaseBEVBackbone`` (integer upsample strides)."""

    def __init__(self, config: PointPillarsConfig, input_channels: int):
        super().__init__()
        eps, mom = config.bn_eps, config.bn_momentum
        c_in = [input_channels, *config.num_filters[:-1]]
        self.blocks = nn.ModuleList()
        self.deblocks = nn.ModuleList()
        for i, (n_layers, stride, c_out) in enumerate(zip(config.layer_nums, config.layer_strides, config.num_filters)):
            layers: list[nn.Module] = [
                nn.ZeroPad2d(1),
                nn.Conv2d(c_in[i], c_out, kernel_size=3, stride=stride, padding=0, bias=False),
                nn.BatchNorm2d(c_out, eps=eps, momentum=mom),
                nn.ReLU(),
            ]
            for _ in range(n_layers):
                layers += [
                    nn.Conv2d(c_out, c_out, kernel_size=3, padding=1, bias=False),
                    nn.BatchNorm2d(c_out, eps=eps, momentum=mom),
                    nn.ReLU(),
                ]
            self.blocks.append(nn.Sequential(*layers))
            up, c_up = int(config.upsample_strides[i]), config.num_upsample_filters[i]
            self.deblocks.append(
                nn.Sequential(
                    nn.ConvTranspose2d(c_out, c_up, up, stride=up, bias=False),
                    nn.BatchNorm2d(c_up, eps=eps, momentum=mom),
                    nn.ReLU(),
                )
            )
        self.num_bev_features = sum(config.num_upsample_filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ups = []
        for block, deblock in zip(self.blocks, self.deblocks):
            x = block(x)
            ups.append(deblock(x))
        return torch.cat(ups, dim=1) if len(ups) > 1 else ups[0]


class AnchorHeadSingle(nn.Module):
    """OpenPCDet's ``AnchorHeadSingle`` convolutions (the anchors live on :class:`PointPillars`)."""

    def __init__(self, config: PointPillarsConfig, input_channels: int):
        super().__init__()
        a = config.num_anchors_per_location
        self.conv_cls = nn.Conv2d(input_channels, a * config.num_classes, kernel_size=1)
        self.conv_box = nn.Conv2d(input_channels, a * 7, kernel_size=1)
        self.conv_dir_cls = nn.Conv2d(input_channels, a * config.num_dir_bins, kernel_size=1)
        pi = 0.01
        nn.init.constant_(self.conv_cls.bias, -math.log((1 - pi) / pi))
        nn.init.normal_(self.conv_box.weight, mean=0, std=0.001)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cls = self.conv_cls(x).permute(0, 2, 3, 1).contiguous()
        box = self.conv_box(x).permute(0, 2, 3, 1).contiguous()
        dirc = self.conv_dir_cls(x).permute(0, 2, 3, 1).contiguous()
        return cls, box, dirc


class PointPillarScatter(nn.Module):
    """OpenPCDet's ``PointPillarScatter`` (no parameters): ``(P, C)`` pillars → ``(B, C, H, W)``."""

    def __init__(self, config: PointPillarsConfig):
        super().__init__()
        self.grid_hw = config.bev_hw

    def forward(self, features: torch.Tensor, coords: torch.Tensor, batch_size: int, reference: bool) -> torch.Tensor:
        if reference:
            from pcops.reference import pillar_scatter as ref

            return ref.pillar_scatter(features, coords.to(torch.int32), batch_size, *self.grid_hw)[0]
        return pcops.pillar_scatter(features, coords, batch_size, self.grid_hw)

"""Frozen configuration of PointPillars, defaulting to OpenPCDet's KITTI model.

``PointPillarsConfig()`` reproduces ``tools/cfgs/kitti_models/pointpillar.yaml`` of OpenPCDet
(with the data settings of ``dataset_configs/kitti_dataset.yaml`` it overrides). Every field
names the YAML key it mirrors. The config is immutable and is passed once to the model's
constructor; no module reads a global or a dictionary at run time.

Deliberate OpenPCDet match: the anchor rotations are ``(0, 1.57)`` as written in the YAML,
not ``(0, π/2)``; the 0.0008 rad difference enters the decoded headings (``r = r_t + r_a``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AnchorConfig", "PointPillarsConfig", "KITTI_ANCHORS"]


@dataclass(frozen=True)
class AnchorConfig:
    """One entry of ``DENSE_HEAD.ANCHOR_GENERATOR_CONFIG`` (one class)."""

    class_name: str
    size: tuple[float, float, float]  # anchor_sizes[0]: (dx, dy, dz) in metres
    bottom_height: float  # anchor_bottom_heights[0]: z of the box bottom in metres
    rotations: tuple[float, ...] = (0.0, 1.57)  # anchor_rotations, radians
    align_center: bool = False  # align_center
    feature_map_stride: int = 2  # feature_map_stride


KITTI_ANCHORS = (
    AnchorConfig("Car", (3.9, 1.6, 1.56), -1.78),
    AnchorConfig("Pedestrian", (0.8, 0.6, 1.73), -0.6),
    AnchorConfig("Cyclist", (1.76, 0.6, 1.73), -0.6),
)


@dataclass(frozen=True)
class PointPillarsConfig:
    """PointPillars hyper-parameters; the defaults are OpenPCDet's KITTI ``pointpillar.yaml``."""

    # DATA_CONFIG
    point_cloud_range: tuple[float, ...] = (0.0, -39.68, -3.0, 69.12, 39.68, 1.0)  # POINT_CLOUD_RANGE
    voxel_size: tuple[float, float, float] = (0.16, 0.16, 4.0)  # VOXEL_SIZE
    max_points_per_voxel: int = 32  # MAX_POINTS_PER_VOXEL
    max_voxels_train: int = 16000  # MAX_NUMBER_OF_VOXELS.train
    max_voxels_test: int = 40000  # MAX_NUMBER_OF_VOXELS.test
    num_point_features: int = 4  # x, y, z, intensity (POINT_FEATURE_ENCODING.used_feature_list)
    # MODEL.VFE (PillarVFE)
    vfe_filters: tuple[int, ...] = (64,)  # NUM_FILTERS
    use_absolute_xyz: bool = True  # USE_ABSLOTE_XYZ (sic, OpenPCDet's spelling)
    with_distance: bool = False  # WITH_DISTANCE
    # MODEL.BACKBONE_2D (BaseBEVBackbone)
    layer_nums: tuple[int, ...] = (3, 5, 5)  # LAYER_NUMS
    layer_strides: tuple[int, ...] = (2, 2, 2)  # LAYER_STRIDES
    num_filters: tuple[int, ...] = (64, 128, 256)  # NUM_FILTERS
    upsample_strides: tuple[int, ...] = (1, 2, 4)  # UPSAMPLE_STRIDES
    num_upsample_filters: tuple[int, ...] = (128, 128, 128)  # NUM_UPSAMPLE_FILTERS
    # BatchNorm everywhere (OpenPCDet hard-codes these)
    bn_eps: float = 1e-3
    bn_momentum: float = 0.01
    # MODEL.DENSE_HEAD (AnchorHeadSingle)
    anchors: tuple[AnchorConfig, ...] = KITTI_ANCHORS  # ANCHOR_GENERATOR_CONFIG
    dir_offset: float = 0.78539  # DIR_OFFSET
    dir_limit_offset: float = 0.0  # DIR_LIMIT_OFFSET
    num_dir_bins: int = 2  # NUM_DIR_BINS
    # MODEL.POST_PROCESSING
    score_thresh: float = 0.1  # SCORE_THRESH
    nms_thresh: float = 0.01  # NMS_CONFIG.NMS_THRESH (rotated BEV IoU, class agnostic)
    nms_pre_max_size: int = 4096  # NMS_CONFIG.NMS_PRE_MAXSIZE
    nms_post_max_size: int = 500  # NMS_CONFIG.NMS_POST_MAXSIZE

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise ValueError(f"{name}: expected {what}, got {getattr(self, name)!r}")

        need(len(self.point_cloud_range) == 6, "point_cloud_range", "6 values (xmin, ymin, zmin, xmax, ymax, zmax)")
        need(len(self.voxel_size) == 3 and all(v > 0 for v in self.voxel_size), "voxel_size", "3 positive values")
        need(self.max_points_per_voxel >= 1, "max_points_per_voxel", "an int >= 1")
        need(self.num_point_features >= 4, "num_point_features", "an int >= 4 (x, y, z, intensity, ...)")
        need(len(self.vfe_filters) >= 1, "vfe_filters", "at least one PFN layer")
        n = len(self.layer_nums)
        need(
            len(self.layer_strides) == n and len(self.num_filters) == n,
            "layer_strides",
            "as many entries as layer_nums (and num_filters)",
        )
        need(
            len(self.upsample_strides) == n and len(self.num_upsample_filters) == n,
            "upsample_strides",
            "one integer stride >= 1 per level (fractional strides are not supported)",
        )
        need(all(int(s) == s and s >= 1 for s in self.upsample_strides), "upsample_strides", "integers >= 1")
        need(len(self.anchors) >= 1, "anchors", "at least one class")
        need(
            len({a.feature_map_stride for a in self.anchors}) == 1, "anchors", "one feature_map_stride for all classes"
        )
        need(self.num_dir_bins >= 1, "num_dir_bins", "an int >= 1")
        need(0.0 <= self.score_thresh <= 1.0, "score_thresh", "a value in [0, 1]")
        need(self.nms_pre_max_size >= 1 and self.nms_post_max_size >= 1, "nms_pre_max_size", "positive sizes")
        for i, (lo, hi, v) in enumerate(zip(self.point_cloud_range[:3], self.point_cloud_range[3:], self.voxel_size)):
            n_cells = (hi - lo) / v
            need(
                hi > lo and abs(n_cells - round(n_cells)) < 1e-4,
                "point_cloud_range",
                f"an extent divisible by voxel_size on axis {i}",
            )

    # --- derived sizes -------------------------------------------------------------------------
    @property
    def grid_size(self) -> tuple[int, int, int]:
        """``(nx, ny, nz)`` voxels, as OpenPCDet's ``grid_size`` (x first)."""
        r, v = self.point_cloud_range, self.voxel_size
        return tuple(int(round((r[i + 3] - r[i]) / v[i])) for i in range(3))  # type: ignore[return-value]

    @property
    def bev_hw(self) -> tuple[int, int]:
        """``(H, W) = (ny, nx)`` of the BEV canvas: (496, 432) for KITTI."""
        nx, ny, nz = self.grid_size
        if nz != 1:
            raise ValueError(f"voxel_size: pillars need one voxel in z, got a grid of {nz}")
        return ny, nx

    @property
    def feature_map_hw(self) -> tuple[int, int]:
        """``(H, W)`` of the head's feature map: the canvas divided by the anchors' stride (248, 216)."""
        h, w = self.bev_hw
        s = self.anchors[0].feature_map_stride
        return h // s, w // s

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(a.class_name for a in self.anchors)

    @property
    def num_classes(self) -> int:
        return len(self.anchors)

    @property
    def num_anchors_per_location(self) -> int:
        """Anchors per feature-map cell: sum over classes of rotations (one size, one height each): 6."""
        return sum(len(a.rotations) for a in self.anchors)

    @property
    def num_anchors(self) -> int:
        h, w = self.feature_map_hw
        return h * w * self.num_anchors_per_location

    @property
    def num_pfn_inputs(self) -> int:
        """Decorated point features: the raw ones (or all but xyz), + 3 cluster + 3 centre offsets (+1)."""
        n = self.num_point_features + (6 if self.use_absolute_xyz else 3)
        return n + (1 if self.with_distance else 0)

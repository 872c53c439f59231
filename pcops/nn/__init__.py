"""``torch.nn`` modules built on pcops' ops.

- ``LayerNormGELU``: LayerNorm + GELU (+ dropout) in one kernel.
- Sparse convolution (spconv 2 compatible: models port by changing the import):
  ``SparseConvTensor``, ``SubMConv3d``, ``SparseConv3d``, ``SparseInverseConv3d``,
  ``SparseSequential``, ``ToDense``, on pcops kernel maps (``pcops.sparse_conv_kernel_map``) and
  ``pcops.sparse_conv3d``; ``fuse_for_inference`` folds eval-mode conv + BatchNorm + ReLU runs
  into single convolutions.
"""

from .layer_norm_gelu import LayerNormGELU
from .sparse import (
    SparseConv3d,
    SparseConvTensor,
    SparseInverseConv3d,
    SparseModule,
    SparseSequential,
    SubMConv3d,
    ToDense,
    fuse_for_inference,
)

__all__ = [
    "LayerNormGELU",
    "SparseConvTensor",
    "SparseModule",
    "SubMConv3d",
    "SparseConv3d",
    "SparseInverseConv3d",
    "SparseSequential",
    "ToDense",
    "fuse_for_inference",
]

"""``pcops.nn.LayerNormGELU``: the fused LayerNorm + GELU (+ dropout) as a module."""

from __future__ import annotations

import torch
from torch import nn

from ..layer_norm_gelu import fused_layer_norm_gelu

__all__ = ["LayerNormGELU"]


class LayerNormGELU(nn.Module):
    """``Dropout(GELU(LayerNorm(x)))`` over the last dimension in one kernel (``pcops.fused_layer_norm_gelu``).

    A drop-in for ``nn.Sequential(nn.LayerNorm(N), nn.GELU(approximate), nn.Dropout(p))``: same
    parameters (``weight`` = 1, ``bias`` = 0 at initialisation), dropout only in training mode.

    Args:
        normalized_shape: ``N``, the size of the last dimension.
        eps: added to the variance. approximate: ``"tanh"`` (default) or ``"none"``.
        dropout_p: drop probability in [0, 1) (0: no dropout).
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        approximate: str = "tanh",
        dropout_p: float = 0.0,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if isinstance(normalized_shape, (tuple, list)):
            if len(normalized_shape) != 1:
                raise ValueError(f"normalized_shape: expected one dimension, got {tuple(normalized_shape)}")
            normalized_shape = normalized_shape[0]
        if isinstance(normalized_shape, bool) or not isinstance(normalized_shape, int):
            raise TypeError(f"normalized_shape: expected an int, got {type(normalized_shape).__name__}")
        if normalized_shape < 1:
            raise ValueError(f"normalized_shape: expected an int >= 1, got {normalized_shape!r}")
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.approximate = approximate
        self.dropout_p = dropout_p
        self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(normalized_shape, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_layer_norm_gelu(
            x, self.weight, self.bias, self.eps, self.approximate, self.dropout_p, self.training
        )

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, approximate={self.approximate!r}, dropout_p={self.dropout_p}"

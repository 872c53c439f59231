"""Sparse-convolution kernel maps in plain PyTorch: the CPU path and the test oracle.

Voxels are keyed by their linear index ``((b * D + z) * H + y) * W + x`` (int64), so
sorting keys sorts voxels lexicographically by ``(batch, z, y, x)``. The input keys are
sorted once; every (output, kernel offset) looks its input up with ``searchsorted``.
Regular and transposed output sets are the unique keys of all candidates (``torch.unique``
sorts them). The pairs layout is read off the out-in table column by column, so within one
offset the pairs are in ascending output order.
"""

from __future__ import annotations

import math

import torch


def linear_key(b: torch.Tensor, zyx: torch.Tensor, shape) -> torch.Tensor:
    """``((b * D + z) * H + y) * W + x`` as int64; ``zyx`` is ``(..., 3)``."""
    d, h, w = shape
    zyx = zyx.long()
    return ((b.long() * d + zyx[..., 0]) * h + zyx[..., 1]) * w + zyx[..., 2]


def decode_key(key: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of ``linear_key``: ``(M, 4)`` int32 ``(b, z, y, x)``."""
    d, h, w = shape
    x = key % w
    rest = key // w
    y = rest % h
    rest = rest // h
    z = rest % d
    b = rest // d
    return torch.stack([b, z, y, x], 1).to(torch.int32)


def kernel_offsets(kernel_size, device) -> torch.Tensor:
    """``(K, 3)`` int64 ``(kz, ky, kx)`` in the documented order ``k = (kz * Ky + ky) * Kx + kx``."""
    grids = torch.meshgrid(*[torch.arange(s, device=device) for s in kernel_size], indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], 1)


def padding_rows(coords: torch.Tensor) -> torch.Tensor:
    """``(N,)`` bool: rows of −1 in all four columns, the padding of the fixed-capacity forms
    (``voxelize(pad_to_max=True)``, static maps): never an input, never an error."""
    return (coords == -1).all(1)


def check_coords(coords: torch.Tensor, spatial_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Raise ``ValueError`` on out-of-grid or duplicate voxels (padding rows aside); return
    ``(sorted_keys, perm)``: the voxels' linear keys in ascending order and the rows they come from."""
    shape = torch.tensor(spatial_shape, device=coords.device)
    zyx = coords[:, 1:].long()
    pad = padding_rows(coords)
    bad = ((coords[:, 0] < 0) | (zyx < 0).any(1) | (zyx >= shape).any(1)) & ~pad
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"coords: row {i} = {coords[i].tolist()} lies outside spatial_shape {tuple(spatial_shape)} "
            "(or has a negative batch index)"
        )
    rows = (~pad).nonzero()[:, 0]
    n = rows.numel()
    keys = linear_key(coords[rows, 0], zyx[rows], spatial_shape)
    sorted_keys, perm = keys.sort(stable=True)
    perm = rows[perm]
    if n > 1:
        dup = sorted_keys[1:] == sorted_keys[:-1]
        if bool(dup.any()):
            j = int(dup.nonzero()[0, 0])
            a, b = sorted(perm[j : j + 2].tolist())
            raise ValueError(f"coords: duplicate voxel {coords[a].tolist()} at rows {a} and {b}")
    return sorted_keys, perm


def out_in_table(
    out_coords: torch.Tensor,
    sorted_keys: torch.Tensor,
    perm: torch.Tensor,
    in_shape,
    kernel_size,
    stride,
    padding,
    dilation,
    transposed: bool,
) -> torch.Tensor:
    """``(M, K)`` int32: the input row feeding each (output, offset), −1 for none.

    Regular (and submanifold, with stride 1 and centred padding): ``i = o * s - p + k * d``.
    Transposed: ``o = i * s - p + k * d``, i.e. ``i = (o + p - k * d) / s`` when it divides.
    """
    dev = out_coords.device
    num_out = out_coords.shape[0]
    offs = kernel_offsets(kernel_size, dev) * torch.tensor(dilation, device=dev)  # (K, 3)
    s = torch.tensor(stride, device=dev)
    p = torch.tensor(padding, device=dev)
    o = out_coords[:, None, 1:].long()  # (M, 1, 3)
    if transposed:
        num = o + p - offs  # (M, K, 3)
        ok = ((num >= 0) & (num % s == 0)).all(2)
        i = num.div(s, rounding_mode="floor")
    else:
        i = o * s - p + offs
        ok = torch.ones(i.shape[:2], dtype=torch.bool, device=dev)
    ok &= ((i >= 0) & (i < torch.tensor(in_shape, device=dev))).all(2) & (out_coords[:, None, 0] >= 0)
    key = linear_key(out_coords[:, None, 0].expand(-1, offs.shape[0]), i, in_shape)
    if sorted_keys.numel() == 0:
        return torch.full((num_out, offs.shape[0]), -1, dtype=torch.int32, device=dev)
    pos = torch.searchsorted(sorted_keys, key).clamp(max=sorted_keys.numel() - 1)
    hit = ok & (sorted_keys[pos] == key)
    return torch.where(hit, perm[pos], -1).to(torch.int32)


def pairs_from_table(out_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs layout of an out-in table: ``pair_in, pair_out (P,)`` int32 grouped by offset
    (ascending output row within an offset) and ``offsets (K+1,)`` int32."""
    t = out_in.t()  # (K, M)
    found = t >= 0
    nz = found.nonzero()  # row-major: by offset, then by output row
    pair_in = t[found].to(torch.int32)
    pair_out = nz[:, 1].to(torch.int32)
    offsets = torch.zeros(t.shape[0] + 1, dtype=torch.int32, device=out_in.device)
    offsets[1:] = found.sum(1).cumsum(0)
    return pair_in, pair_out, offsets


def output_coords(coords, in_shape, out_shape, kernel_size, stride, padding, dilation, transposed):
    """Sorted unique output voxels ``(M, 4)`` int32 of a regular or transposed conv."""
    coords = coords[~padding_rows(coords)]
    dev = coords.device
    offs = kernel_offsets(kernel_size, dev) * torch.tensor(dilation, device=dev)  # (K, 3)
    s = torch.tensor(stride, device=dev)
    p = torch.tensor(padding, device=dev)
    i = coords[:, None, 1:].long()  # (N, 1, 3)
    if transposed:
        o = i * s - p + offs  # every offset spreads an input to one output
        ok = torch.ones(o.shape[:2], dtype=torch.bool, device=dev)
    else:
        num = i + p - offs  # o * s = i + p - k * d must divide
        ok = ((num >= 0) & (num % s == 0)).all(2)
        o = num.div(s, rounding_mode="floor")
    ok &= ((o >= 0) & (o < torch.tensor(out_shape, device=dev))).all(2)
    key = linear_key(coords[:, None, 0].expand(-1, offs.shape[0]), o, out_shape)
    uniq = torch.unique(key[ok], sorted=True)
    return decode_key(uniq, out_shape)


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(out_coords, pair_in, pair_out, offsets, out_in)``; see ``pcops.sparse_conv_kernel_map``.
    ``pairs=False``: the pair arrays are empty, and so is ``offsets`` except for a static
    regular/transposed map: ``(1,)`` int32, the output count ``M`` (before the cut below).
    ``max_outputs`` (static regular/transposed): at most this many output rows (``0``: ``N·J``).

    For ``subm`` the caller passes stride 1 and the centred padding ``(K - 1) // 2 * d``.
    ``pad_pairs``: the pair arrays get ``M·K`` entries, −1 past ``P``.
    ``static_shapes``: submanifold as ``pad_pairs``; regular/transposed: ``out_coords`` and
    ``out_in`` get ``N·J`` rows and the pair arrays ``N·J`` entries (``J =
    outputs_per_input(...)``), −1 past ``M`` and ``P``.
    Raises ``ValueError`` on out-of-grid or duplicate input voxels, and (static regular or
    transposed maps) on batch indices ``>= batch_size``.
    """
    sorted_keys, perm = check_coords(coords, in_shape)
    if static_shapes and not subm and coords.shape[0] and int(coords[:, 0].max()) >= batch_size:
        raise ValueError(f"coords: batch index {int(coords[:, 0].max())} is not below batch_size={batch_size}")
    # (padding rows, batch -1, are below any batch_size)
    if subm:
        out_coords = coords.clone()
    else:
        out_coords = output_coords(coords, in_shape, out_shape, kernel_size, stride, padding, dilation, transposed)
    out_in = out_in_table(out_coords, sorted_keys, perm, in_shape, kernel_size, stride, padding, dilation, transposed)
    static_out = static_shapes and not subm
    if static_out:
        bound = cap = coords.shape[0] * outputs_per_input(kernel_size, stride, dilation, transposed)
        if max_outputs > 0:
            cap = min(bound, max_outputs)
        count = torch.tensor([out_coords.shape[0]], dtype=torch.int32, device=out_in.device)
        out_coords, out_in = out_coords[:cap], out_in[:cap]
    if not pairs:
        empty = out_in.new_empty((0,))
        if static_out:
            out_coords, out_in = _pad_rows(out_coords, cap), _pad_rows(out_in, cap)
        return out_coords, empty, empty.clone(), count if static_out else empty.clone(), out_in
    pair_in, pair_out, offsets = pairs_from_table(out_in)
    if static_out:
        out_coords, out_in = _pad_rows(out_coords, cap), _pad_rows(out_in, cap)
        pair_in, pair_out = _pad_rows(pair_in, bound), _pad_rows(pair_out, bound)  # one per (input, offset)
    elif pad_pairs or static_shapes:
        pair_in, pair_out = _pad_rows(pair_in, out_in.numel()), _pad_rows(pair_out, out_in.numel())
    return out_coords, pair_in, pair_out, offsets, out_in


def outputs_per_input(kernel_size, stride, dilation, transposed: bool) -> int:
    """How many outputs one input voxel can reach: transposed, every offset (``K``); regular,
    per axis the offsets ``k`` with ``k * d`` in one residue class mod ``s``: ``ceil(K / (s /
    gcd(d, s)))`` (8 of 27 for 3×3×3 stride 2)."""
    if transposed:
        return math.prod(kernel_size)
    return math.prod(-(-k // (s // math.gcd(d, s))) for k, s, d in zip(kernel_size, stride, dilation))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` followed by −1 rows up to ``rows`` rows."""
    return torch.cat([t, t.new_full((rows - t.shape[0], *t.shape[1:]), -1)])


def inverse_table(out_in: torch.Tensor, num_in: int) -> torch.Tensor:
    """``(num_in, K)`` int32: for each input row and offset, the output row it feeds (−1 for none).

    Each (input, offset) feeds at most one output, so the scatter writes every real cell at
    most once (deterministic); the −1 cells of ``out_in`` all go to a discarded extra row.
    """
    num_out, k = out_in.shape
    inv = torch.full((num_in + 1, k), -1, dtype=torch.int64, device=out_in.device)
    rows = torch.where(out_in >= 0, out_in.long(), num_in)
    src = torch.arange(num_out, device=out_in.device).view(num_out, 1).expand(num_out, k)
    inv.scatter_(0, rows, src)
    return inv[:num_in].to(torch.int32)


def sparse_conv3d(features, weight, bias, out_in, chunk_elems: int = 1 << 25, relu: bool = False):
    """``out[o] = bias + sum_k features[out_in[o, k]] @ weight[k]`` (rows with −1 skipped), then
    ``max(·, 0)`` where ``relu``.

    Implicit-GEMM formulation on the out-in table: gather ``(M, Kc, C_in)`` for a chunk of
    offsets and multiply by ``weight[k0:k1]`` flattened, in a fixed order (deterministic, no
    atomics); accumulates in float32 for float16/bfloat16.
    """
    num_in, c_in = features.shape
    num_out, k = out_in.shape
    c_out = weight.shape[2]
    acc_dtype = torch.float32 if features.dtype in (torch.float16, torch.bfloat16) else features.dtype
    out = torch.zeros((num_out, c_out), dtype=acc_dtype, device=features.device)
    padded = torch.cat([features, features.new_zeros(1, c_in)])
    rows = torch.where(out_in >= 0, out_in.long(), num_in)
    step = max(1, chunk_elems // max(1, num_out * c_in))
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        g = padded[rows[:, k0:k1]].reshape(num_out, (k1 - k0) * c_in)
        out += (g @ weight[k0:k1].reshape((k1 - k0) * c_in, c_out)).to(acc_dtype)
    if bias is not None:
        out += bias.to(acc_dtype)
    if relu:
        out.clamp_(min=0)
    return out.to(features.dtype)


def sparse_conv3d_backward(
    grad_out, features, weight, out_in, need_features: bool, need_weight: bool, chunk_elems: int = 1 << 25
):
    """Gradients of ``sparse_conv3d`` w.r.t. features and weight, both without atomics.

    ``grad_features[i] = sum_k grad_out[in_out[i, k]] @ weight[k]^T`` through the inverse
    table (each input feeds one output per offset); ``grad_weight[k] = gathered^T @ grad_out``.
    """
    num_in, c_in = features.shape
    num_out, k = out_in.shape
    c_out = weight.shape[2]
    acc_dtype = torch.float32 if features.dtype in (torch.float16, torch.bfloat16) else features.dtype
    grad_features = grad_weight = None
    if need_features:
        inv = inverse_table(out_in, num_in)
        rows = torch.where(inv >= 0, inv.long(), num_out)
        g_pad = torch.cat([grad_out, grad_out.new_zeros(1, c_out)])
        acc = torch.zeros((num_in, c_in), dtype=acc_dtype, device=features.device)
        step = max(1, chunk_elems // max(1, num_in * c_out))
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            g = g_pad[rows[:, k0:k1]].reshape(num_in, (k1 - k0) * c_out)
            wt = weight[k0:k1].transpose(1, 2).reshape((k1 - k0) * c_out, c_in)
            acc += (g @ wt).to(acc_dtype)
        grad_features = acc.to(features.dtype)
    if need_weight:
        padded = torch.cat([features, features.new_zeros(1, c_in)])
        rows = torch.where(out_in >= 0, out_in.long(), num_in)
        grad_weight = torch.empty_like(weight)
        step = max(1, chunk_elems // max(1, num_out * c_in))
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            g = padded[rows[:, k0:k1]].reshape(num_out, (k1 - k0) * c_in)
            gw = (g.t() @ grad_out).reshape(k1 - k0, c_in, c_out)
            grad_weight[k0:k1] = gw.to(weight.dtype)
    return grad_features, grad_weight


def bitmap_index(out_coords: torch.Tensor, batch_size: int, out_shape) -> tuple[torch.Tensor, torch.Tensor]:
    """The bitmap index of a static regular map's outputs (``out_coords`` uncut, rows with batch
    index −1 ignored): ``bits`` ``(W,)`` int32 over the ``batch_size · D·H·W`` cells, a cleared
    bit per output (bit ``c & 31`` of word ``c >> 5`` for the linear cell ``c``), and ``prefix``
    ``(W,)`` int32, the outputs in the words before each word (so an output's row is its word's
    prefix plus the cleared bits below it in its word)."""
    d, h, w = (int(v) for v in out_shape)
    words = -(-batch_size * d * h * w // 32)
    c = out_coords[out_coords[:, 0] >= 0].long()
    occ = torch.zeros(words * 32, dtype=torch.bool, device=out_coords.device)
    occ[((c[:, 0] * d + c[:, 1]) * h + c[:, 2]) * w + c[:, 3]] = True
    occ = occ.view(words, 32)
    per_word = occ.sum(1)
    prefix = (per_word.cumsum(0) - per_word).to(torch.int32)
    shifts = torch.arange(32, device=out_coords.device)
    packed = ((~occ).long() << shifts).sum(1)  # [0, 2^32): as int32 with wrap-around
    bits = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return bits, prefix

"""pcops.pfn_scatter / fold_batchnorm: the reference vs an unfused PillarVFE oracle (Linear, then
eval-mode BatchNorm), the Triton kernel (interpreter) vs the reference, the backend contract,
registration, bad input."""

import logging

import pytest
import torch

import pcops
from pcops.reference import pfn as ref
from _util import generator, interpret, requires_cuda

VOXEL = (0.16, 0.16, 4.0)
RANGE_MIN = (0.0, -39.68, -3.0)
B, H, W = 2, 12, 10


def make_case(num, slots=8, channels=16, feats=4, seed=0, device="cpu"):
    """``num`` pillars on distinct cells of a (B, H, W) grid, random point counts (one empty row, one
    row outside the grid), zero-padded slots; a PFN layer with BatchNorm statistics."""
    g = generator(seed)
    lin = torch.randperm(B * H * W, generator=g)[:num]
    b, rest = lin // (H * W), lin % (H * W)
    coords = torch.stack([b, torch.zeros_like(b), rest // W, rest % W], 1).to(torch.int32)
    n = torch.randint(1, slots + 1, (num,), generator=g).to(torch.int32)
    if num > 2:
        n[1] = 0  # an unused capacity row
        coords[2, 3] = W  # outside the canvas: skipped
    centre_x = coords[:, 3].float() * VOXEL[0] + VOXEL[0] / 2 + RANGE_MIN[0]
    centre_y = coords[:, 2].float() * VOXEL[1] + VOXEL[1] / 2 + RANGE_MIN[1]
    pts = torch.rand(num, slots, feats, generator=g)
    pts[..., 0] = centre_x[:, None] + (pts[..., 0] - 0.5) * VOXEL[0]
    pts[..., 1] = centre_y[:, None] + (pts[..., 1] - 0.5) * VOXEL[1]
    pts[..., 2] = pts[..., 2] * 3 - 2.5
    pts = pts * (torch.arange(slots)[None, :] < n[:, None].long())[..., None]  # zero padding slots
    layer = dict(
        linear=torch.randn(channels, 10, generator=g) * 0.3,
        gamma=torch.rand(channels, generator=g) + 0.5,
        beta=torch.randn(channels, generator=g),
        mean=torch.randn(channels, generator=g) * 0.1,
        var=torch.rand(channels, generator=g) + 0.5,
        eps=1e-3,
    )
    to = lambda t: t.to(device)
    return to(pts), to(n), to(coords), {k: (to(v) if isinstance(v, torch.Tensor) else v) for k, v in layer.items()}


def unfused_oracle(pts, n, coords, layer):
    """OpenPCDet's PillarVFE, one pillar at a time: decorate, Linear, BatchNorm (eval), ReLU, max."""
    out = []
    for p in range(pts.shape[0]):
        xyz = pts[p, :, :3].double()
        cnt = max(int(n[p]), 1)
        mean = xyz.sum(0) / cnt
        centre = torch.tensor(
            [
                float(coords[p, 3]) * VOXEL[0] + VOXEL[0] / 2 + RANGE_MIN[0],
                float(coords[p, 2]) * VOXEL[1] + VOXEL[1] / 2 + RANGE_MIN[1],
                float(coords[p, 1]) * VOXEL[2] + VOXEL[2] / 2 + RANGE_MIN[2],
            ],
            dtype=torch.float64,
        )
        f = torch.cat([pts[p, :, :4].double(), xyz - mean, xyz - centre], 1)
        f[int(n[p]) :] = 0
        z = f @ layer["linear"].double().t()
        z = (z - layer["mean"].double()) / torch.sqrt(layer["var"].double() + layer["eps"]) * layer["gamma"].double()
        out.append(torch.relu(z + layer["beta"].double()).amax(0))
    return torch.stack(out)


def folded(layer):
    return pcops.fold_batchnorm(
        layer["linear"], layer["gamma"], layer["beta"], layer["mean"], layer["var"], layer["eps"]
    )


def live_rows(n, coords, count=None):
    live = (n > 0) & (coords[:, 3] < W)
    if count is not None:
        live &= torch.arange(n.shape[0], device=n.device) < count
    return live


@pytest.mark.parametrize("num,slots,feats", [(1, 1, 4), (7, 8, 4), (30, 32, 5)])
def test_reference_matches_unfused_pillar_vfe(num, slots, feats):
    pts, n, coords, layer = make_case(num, slots=slots, feats=feats, seed=num)
    w, b = folded(layer)
    canvas = torch.zeros(B, w.shape[1], H, W)
    assert pcops.pfn_scatter(pts, n, coords, w, b, canvas, VOXEL, RANGE_MIN) is canvas
    live = live_rows(n, coords)
    bl, yl, xl = coords[live, 0].long(), coords[live, 2].long(), coords[live, 3].long()
    want = unfused_oracle(pts, n, coords, layer)[live]
    torch.testing.assert_close(canvas[bl, :, yl, xl].double(), want, atol=2e-5, rtol=1e-5)
    # nothing else is written
    canvas[bl, :, yl, xl] = 0
    assert not canvas.any()


def test_count_channels_last_and_half_canvas():
    pts, n, coords, layer = make_case(20, seed=3)
    w, b = folded(layer)
    full = pcops.pfn_scatter(pts, n, coords, w, b, torch.zeros(B, 16, H, W), VOXEL, RANGE_MIN)
    canvas = torch.zeros(B, H, W, 16, dtype=torch.float16).permute(0, 3, 1, 2)  # channels-last
    count = torch.tensor([9], dtype=torch.int32)
    pcops.pfn_scatter(pts, n, coords, w, b, canvas, VOXEL, RANGE_MIN, count)
    keep = live_rows(n, coords, 9)
    bl, yl, xl = coords[:, 0].long(), coords[:, 2].long(), coords[:, 3].long().clamp(max=W - 1)
    got = canvas.float()[bl, :, yl, xl]
    torch.testing.assert_close(got[keep], full[bl, :, yl, xl][keep], atol=1e-2, rtol=1e-3)
    assert int(canvas.count_nonzero()) == int(got[keep].count_nonzero())


def test_backend_contract_and_bad_input(caplog):
    pts, n, coords, layer = make_case(6, seed=4)
    w, b = folded(layer)
    args = lambda **kw: {
        **dict(
            voxels=pts,
            num_points=n,
            coords=coords,
            weight=w,
            bias=b,
            canvas=torch.zeros(B, 16, H, W),
            voxel_size=VOXEL,
            range_min=RANGE_MIN,
        ),
        **kw,
    }
    with caplog.at_level(logging.DEBUG, logger="pcops"):
        got = pcops.pfn_scatter(**args(backend="reference"))
    assert caplog.records[-1].getMessage() == "pfn_scatter: reference"
    assert torch.equal(got, pcops.pfn_scatter(**args()))
    with pytest.raises(ValueError, match="backend.*CUDA tensors"):
        pcops.pfn_scatter(**args(backend="triton"))
    with pytest.raises(ValueError, match="backend: pfn_scatter has no 'cuda'"):
        pcops.pfn_scatter(**args(backend="cuda"))
    for bad, exc, name in [
        (dict(voxels=pts[..., :3]), ValueError, "voxels"),
        (dict(voxels=pts.int()), TypeError, "voxels"),
        (dict(num_points=n[:3]), ValueError, "num_points"),
        (dict(coords=coords[:, :3]), ValueError, "coords"),
        (dict(weight=w[:9]), ValueError, "weight"),
        (dict(weight=w.double()), TypeError, "weight"),
        (dict(bias=b[:4]), ValueError, "weight"),
        (dict(canvas=torch.zeros(B, 8, H, W)), ValueError, "weight"),
        (dict(canvas=torch.zeros(16, H, W)), ValueError, "canvas"),
        (dict(count=torch.tensor([1, 2])), ValueError, "count"),
        (dict(count=torch.tensor([1.0])), TypeError, "count"),
        (dict(voxel_size=(0.16, 0.16)), ValueError, "voxel_size"),
        (dict(voxel_size=(0.16, 0.0, 4.0)), ValueError, "voxel_size"),
        (dict(backend="cpp"), ValueError, "backend"),
    ]:
        with pytest.raises(exc, match=name):
            pcops.pfn_scatter(**args(**bad))


def test_opcheck_and_compile():
    pts, n, coords, layer = make_case(9, seed=5)
    w, b = folded(layer)
    count = torch.tensor([7], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.pcops.pfn_scatter,
        (pts, n, coords, w, b, torch.zeros(B, 16, H, W), list(VOXEL), list(RANGE_MIN), count, "auto"),
    )

    @torch.compile(fullgraph=True, backend="aot_eager")
    def net(pts, n, coords):
        canvas = torch.zeros(B, 16, H, W)
        return pcops.pfn_scatter(pts * 1.0, n, coords, w, b, canvas, VOXEL, RANGE_MIN).relu().sum(1)

    want = pcops.pfn_scatter(pts, n, coords, w, b, torch.zeros(B, 16, H, W), VOXEL, RANGE_MIN).relu().sum(1)
    torch.testing.assert_close(net(pts, n, coords), want)


def test_old_import_path():
    from pcops.triton.pfn import fold_batchnorm, pfn_scatter  # the model's import before the op existed

    assert fold_batchnorm is pcops.fold_batchnorm and callable(pfn_scatter)


# --- the Triton kernel under the CPU interpreter ---------------------------------------------


@pytest.mark.parametrize("num,slots,channels,feats", [(1, 1, 1, 4), (7, 8, 16, 4), (13, 32, 64, 5)])
@interpret
def test_triton_interpreter_matches_reference(num, slots, channels, feats):
    from pcops.triton import pfn as tri

    pts, n, coords, layer = make_case(num, slots=slots, channels=channels, feats=feats, seed=num + 10)
    w, b = folded(layer)
    for count in (None, torch.tensor([max(1, num // 2)], dtype=torch.int32)):
        want = torch.zeros(B, channels, H, W)
        ref.pfn_scatter(pts, n, coords, w, b, want, VOXEL, RANGE_MIN, count)
        got = tri.pfn_scatter(pts, n, coords, w, b, torch.zeros(B, channels, H, W), VOXEL, RANGE_MIN, count=count)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    half = torch.zeros(B, H, W, channels, dtype=torch.float16).permute(0, 3, 1, 2)
    tri.pfn_scatter(pts, n, coords, w, b, half, VOXEL, RANGE_MIN)
    torch.testing.assert_close(half.float(), want_full(pts, n, coords, w, b, channels), atol=1e-2, rtol=1e-3)
    with pytest.raises(ValueError, match="variant"):
        tri.pfn_scatter(pts, n, coords, w, b, half, VOXEL, RANGE_MIN, variant="rank1")


def want_full(pts, n, coords, w, b, channels):
    out = torch.zeros(B, channels, H, W)
    ref.pfn_scatter(pts, n, coords, w, b, out, VOXEL, RANGE_MIN)
    return out


# --- the GPU path ------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num", [1, 13, 240])
def test_gpu_matches_reference(num, caplog):
    pts, n, coords, layer = make_case(num, slots=32, channels=64, seed=num, device="cuda")
    w, b = folded(layer)
    for count in (None, torch.tensor([max(1, num // 2)], dtype=torch.int32, device="cuda")):
        want = torch.zeros(B, 64, H, W, device="cuda")
        pcops.pfn_scatter(pts, n, coords, w, b, want, VOXEL, RANGE_MIN, count, backend="reference")
        with caplog.at_level(logging.DEBUG, logger="pcops"):
            got = pcops.pfn_scatter(pts, n, coords, w, b, torch.zeros_like(want), VOXEL, RANGE_MIN, count)
        assert caplog.records[-1].getMessage() == "pfn_scatter: triton"
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        half = torch.zeros(B, H, W, 64, dtype=torch.float16, device="cuda").permute(0, 3, 1, 2)
        pcops.pfn_scatter(pts, n, coords, w, b, half, VOXEL, RANGE_MIN, count, backend="triton")
        torch.testing.assert_close(half.float(), want, atol=2e-2, rtol=1e-3)
    torch.library.opcheck(
        torch.ops.pcops.pfn_scatter,
        (pts, n, coords, w, b, torch.zeros(B, 64, H, W, device="cuda"), list(VOXEL), list(RANGE_MIN), None, "triton"),
    )

"""pcops.nn sparse convolution layers (issue 21) against dense F.conv3d / F.conv_transpose3d.

Every layer's output at its active voxels equals the dense convolution of the voxel grid (zeros
where no voxel) with the same weights; the backward equals the dense backward; kernel maps are
reused per ``indice_key``; spconv 1.x weights load converted.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from _util import generator

import pcops
from pcops import nn as pnn
from pcops.nn import sparse as sparse_mod


def random_voxels(batch, shape, n_per_batch, channels, seed, dtype=torch.float64):
    """Unique random voxels (shuffled rows) with features, as a SparseConvTensor."""
    g = generator(seed)
    d, h, w = shape
    rows = []
    for b, n in zip(range(batch), n_per_batch):
        lin = torch.randperm(d * h * w, generator=g)[:n]
        rows.append(torch.stack([torch.full_like(lin, b), lin // (h * w), (lin // w) % h, lin % w], 1))
    idx = torch.cat(rows)
    idx = idx[torch.randperm(idx.shape[0], generator=g)].to(torch.int32)
    feats = torch.randn(idx.shape[0], channels, generator=g, dtype=torch.float64).to(dtype)
    return pnn.SparseConvTensor(feats, idx, shape, batch)


def at(dense, indices):
    """Rows of a dense ``(B, C, D, H, W)`` tensor at ``indices (N, 4)``."""
    i = indices.long()
    return dense[i[:, 0], :, i[:, 1], i[:, 2], i[:, 3]]


def dense_weight(conv):
    return conv.weight.permute(0, 4, 1, 2, 3)  # (C_out, C_in, kz, ky, kx)


def make(cls, *args, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs).double()


@pytest.mark.parametrize("kernel,dilation", [(3, 1), ((3, 1, 3), 1), (3, 2), (5, 1)])
def test_subm_matches_dense(kernel, dilation):
    x = random_voxels(2, (6, 7, 5), (40, 25), 3, seed=1)
    conv = make(pnn.SubMConv3d, 3, 4, kernel, dilation=dilation, indice_key="a")
    y = conv(x)
    assert torch.equal(y.indices, x.indices) and y.spatial_shape == x.spatial_shape
    ks = conv.kernel_size
    pad = tuple((k - 1) // 2 * dilation for k in ks)
    ref = F.conv3d(x.dense(), dense_weight(conv), conv.bias, padding=pad, dilation=dilation)
    torch.testing.assert_close(y.features, at(ref, x.indices))


@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, 1), (3, 2, 0), ((3, 1, 1), (2, 1, 1), 0), (2, 2, 0)])
def test_sparse_conv_matches_dense(kernel, stride, padding):
    x = random_voxels(2, (9, 8, 7), (60, 30), 2, seed=2)
    conv = make(pnn.SparseConv3d, 2, 3, kernel, stride, padding, bias=False, indice_key="down")
    y = conv(x)
    ref = F.conv3d(x.dense(), dense_weight(conv), None, stride=stride, padding=padding)
    assert y.spatial_shape == list(ref.shape[2:])
    torch.testing.assert_close(y.features, at(ref, y.indices))
    # every voxel of the dense output that some input reaches is an output voxel
    reached = F.conv3d((x.dense() != 0).any(1, keepdim=True).double(), torch.ones(1, 1, *conv.kernel_size,
                       dtype=torch.float64), stride=stride, padding=padding)[:, 0] > 0  # fmt: skip
    assert int(reached.sum()) == y.indices.shape[0]
    assert bool(reached[tuple(y.indices.long().t())].all())
    keys = y.indices.long()
    lin = ((keys[:, 0] * 1000 + keys[:, 1]) * 1000 + keys[:, 2]) * 1000 + keys[:, 3]
    assert bool((lin[1:] > lin[:-1]).all())  # sorted by (batch, z, y, x)


def test_inverse_conv_matches_transposed_dense():
    x = random_voxels(2, (8, 6, 7), (50, 20), 3, seed=3)
    down = make(pnn.SparseConv3d, 3, 4, 3, 2, 1, indice_key="sp1")
    up = make(pnn.SparseInverseConv3d, 4, 2, 3, indice_key="sp1")
    y = down(x)
    z = up(y)
    assert torch.equal(z.indices, x.indices) and z.spatial_shape == x.spatial_shape
    shape_t = [(o - 1) * 2 - 2 + 3 for o in y.spatial_shape]
    out_pad = [s - t for s, t in zip(x.spatial_shape, shape_t)]
    ref = F.conv_transpose3d(y.dense(), up.weight.permute(4, 0, 1, 2, 3), up.bias, stride=2, padding=1,
                             output_padding=out_pad)  # fmt: skip
    torch.testing.assert_close(z.features, at(ref, x.indices))


def test_gradients_match_dense():
    x = random_voxels(1, (5, 6, 4), (30,), 3, seed=4)
    feats = x.features.clone().requires_grad_(True)
    x = x.replace_feature(feats)
    conv = make(pnn.SubMConv3d, 3, 2, 3, indice_key="g")
    down = make(pnn.SparseConv3d, 2, 2, 3, 2, 1)
    y = down(conv(x))
    g = torch.randn(y.features.shape, generator=generator(5), dtype=torch.float64)
    (y.features * g).sum().backward()
    dense_in = x.dense().detach().requires_grad_(True)
    # the sparse net only sees active sites: mask the dense intermediate the same way
    mask = (x.dense() != 0).any(1, keepdim=True)
    mid = F.conv3d(dense_in, dense_weight(conv), conv.bias, padding=1) * mask
    ref = F.conv3d(mid, dense_weight(down), down.bias, stride=2, padding=1)
    gd = torch.zeros_like(ref)
    i = y.indices.long()
    gd[i[:, 0], :, i[:, 1], i[:, 2], i[:, 3]] = g
    grads = torch.autograd.grad(ref, [dense_in, conv.weight, down.weight, conv.bias, down.bias], gd)
    torch.testing.assert_close(feats.grad, at(grads[0], x.indices))
    torch.testing.assert_close(conv.weight.grad, grads[1])
    torch.testing.assert_close(down.weight.grad, grads[2])
    torch.testing.assert_close(conv.bias.grad, grads[3])
    torch.testing.assert_close(down.bias.grad, grads[4])


def test_gradcheck_float64():
    x = random_voxels(1, (4, 4, 3), (12,), 2, seed=6)
    conv = make(pnn.SubMConv3d, 2, 2, 3)
    feats = x.features.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: conv(x.replace_feature(f)).features, (feats,))


def test_indice_key_reuse(monkeypatch):
    calls = []
    real = sparse_mod.sparse_conv_kernel_map
    monkeypatch.setattr(sparse_mod, "sparse_conv_kernel_map", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = random_voxels(1, (6, 6, 6), (50,), 4, seed=7)
    net = pnn.SparseSequential(
        pnn.SubMConv3d(4, 8, 3, indice_key="s1"),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        pnn.SubMConv3d(8, 8, 3, indice_key="s1"),
        pnn.SparseConv3d(8, 8, 3, 2, 1, indice_key="d1"),
        pnn.SubMConv3d(8, 8, 3, indice_key="s2"),
        pnn.SparseInverseConv3d(8, 4, 3, indice_key="d1"),
        pnn.SubMConv3d(4, 4, 3, indice_key="s1"),
    ).double()
    y = net(x)
    assert len(calls) == 3  # s1 once, d1 once, s2 once; the inverse and later s1 layers reuse maps
    assert torch.equal(y.indices, x.indices) and y.features.shape == (50, 4)
    assert set(y.indice_dict) == {"s1", "d1", "s2"}
    dense = pnn.ToDense()(y)
    assert dense.shape == (1, 4, 6, 6, 6) and torch.equal(at(dense, y.indices), y.features)


def test_spconv1_weights_load_converted():
    conv = make(pnn.SubMConv3d, 3, 5, (3, 2, 1), indice_key="w")
    w1 = torch.randn(3, 2, 1, 3, 5, generator=generator(8), dtype=torch.float64)  # (kz, ky, kx, C_in, C_out)
    conv.load_state_dict({"weight": w1, "bias": torch.zeros(5, dtype=torch.float64)})
    assert torch.equal(conv.weight, w1.permute(4, 0, 1, 2, 3))
    x = random_voxels(1, (5, 5, 5), (30,), 3, seed=9)
    y = conv(x).features  # an even kernel (ky = 2) has no symmetric padding: an explicit sum
    dense = x.dense()
    expect = torch.zeros(30, 5, dtype=torch.float64)
    idx = x.indices.long()
    for kz in range(3):
        for ky in range(2):
            zz, yy = idx[:, 1] + kz - 1, idx[:, 2] + ky - 0
            ok = (zz >= 0) & (zz < 5) & (yy >= 0) & (yy < 5)
            vals = torch.zeros(30, 3, dtype=torch.float64)
            vals[ok] = dense[idx[ok, 0], :, zz[ok], yy[ok], idx[ok, 3]]
            expect += vals @ w1[kz, ky, 0]
    torch.testing.assert_close(y, expect)
    with pytest.raises(ValueError, match="weight: expected spconv 2's"):
        conv.load_state_dict({"weight": torch.zeros(5, 3, 3, 3, 3, dtype=torch.float64), "bias": torch.zeros(5)})


def test_bad_input():
    x = random_voxels(1, (4, 4, 4), (10,), 3, seed=10, dtype=torch.float32)
    with pytest.raises(ValueError, match="expects 4 channels"):
        pnn.SubMConv3d(4, 2, 3)(x)
    with pytest.raises(ValueError, match="groups"):
        pnn.SubMConv3d(3, 2, 3, groups=2)
    with pytest.raises(ValueError, match="stride"):
        pnn.SubMConv3d(3, 2, 3, stride=2)
    with pytest.raises(ValueError, match="indice_key"):
        pnn.SparseInverseConv3d(3, 2, 3)
    with pytest.raises(ValueError, match="no SparseConv3d ran"):
        pnn.SparseInverseConv3d(3, 2, 3, indice_key="none")(x)
    with pytest.raises(TypeError, match="SparseConvTensor"):
        pnn.SubMConv3d(3, 2, 3)(x.features)
    with pytest.raises(TypeError, match="features are torch.float32 but the weight is torch.float64"):
        pnn.SubMConv3d(3, 2, 3).double()(x)
    with pytest.raises(ValueError, match="indices: expected 10 rows"):
        pnn.SparseConvTensor(x.features, x.indices[:5], (4, 4, 4), 1)
    outside = x.indices.clone()
    outside[0, 1] = 4
    with pytest.raises(ValueError):
        pnn.SubMConv3d(3, 2, 3)(pnn.SparseConvTensor(x.features, outside, (4, 4, 4), 1))
    dup = x.indices.clone()
    dup[1] = dup[0]
    with pytest.raises(ValueError):
        pnn.SubMConv3d(3, 2, 3)(pnn.SparseConvTensor(x.features, dup, (4, 4, 4), 1))


def test_empty_input_and_half_odd_channels():
    empty = pnn.SparseConvTensor(torch.zeros(0, 3), torch.zeros(0, 4, dtype=torch.int32), (4, 4, 4), 2)
    assert pnn.SubMConv3d(3, 5, 3)(empty).features.shape == (0, 5)
    assert pnn.SparseConv3d(3, 5, 3, 2, 1)(empty).features.shape == (0, 5)
    x = random_voxels(2, (5, 6, 7), (40, 10), 5, seed=11, dtype=torch.float32)
    conv = pnn.SubMConv3d(5, 7, 3)
    y32 = conv(x).features
    y16 = conv.half()(x.replace_feature(x.features.half())).features  # channels not a multiple of 8
    torch.testing.assert_close(y16.float(), y32, atol=2e-2, rtol=2e-2)


def test_sparse_tensor_dense_round_trip():
    x = random_voxels(2, (3, 4, 5), (7, 9), 2, seed=12, dtype=torch.float32)
    back = pnn.SparseConvTensor.from_dense(x.dense(channels_first=False))
    order = lambda t: (t.indices.long() * torch.tensor([1000, 100, 10, 1])).sum(1).argsort()  # noqa: E731
    assert torch.equal(back.indices[order(back)], x.indices[order(x)])
    assert torch.equal(back.features[order(back)], x.features[order(x)])
    assert "SparseConvTensor" in repr(x) and pcops.nn.SubMConv3d(2, 2, 3, indice_key="k").extra_repr()


# --- SECOND's middle encoder (OpenPCDet VoxelBackBone8x) --------------------------------------

OPENPCDET_KEYS = {  # conv weights of OpenPCDet's VoxelBackBone8x state dict, and their kernels
    "conv_input.0.weight": (3, 3, 3),
    "conv1.0.0.weight": (3, 3, 3),
    **{f"conv{i}.{j}.0.weight": (3, 3, 3) for i in (2, 3, 4) for j in range(3)},
    "conv_out.0.weight": (3, 1, 1),
}


def small_second(seed=0):
    from pcops.models.second import VoxelBackBone8x

    torch.manual_seed(seed)
    net = VoxelBackBone8x(4, grid_size=(24, 20, 40)).double().eval()
    for m in net.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return net


def test_second_encoder_names_shapes_and_both_layouts():
    net = small_second()
    sd = net.state_dict()
    convs = {k: v for k, v in sd.items() if k.endswith("weight") and v.dim() == 5}
    assert set(convs) == set(OPENPCDET_KEYS)
    assert all(tuple(convs[k].shape[1:4]) == OPENPCDET_KEYS[k] for k in convs)
    x = random_voxels(2, net.sparse_shape, (300, 200), 4, seed=13)
    out = net(x)
    enc = out["encoded_spconv_tensor"]
    assert enc.features.shape[1] == 128 and enc.spatial_shape == [2, 3, 3]  # from (41, 20, 24), as KITTI's 41
    assert [out["multi_scale_3d_features"][f"x_conv{i}"].features.shape[1] for i in (1, 2, 3, 4)] == [16, 32, 64, 64]
    assert net.to_bev(enc).shape == (2, 256, 3, 3)
    # an OpenPCDet checkpoint in spconv 1.x layout (kz, ky, kx, C_in, C_out) gives the same outputs
    old = {f"backbone_3d.{k}": (v.permute(1, 2, 3, 4, 0) if k in convs else v) for k, v in sd.items()}
    other = small_second(seed=1)
    other.load_openpcdet({"model_state": old})
    torch.testing.assert_close(other(x)["encoded_spconv_tensor"].features, enc.features)
    with pytest.raises(ValueError, match="no keys start with"):
        other.load_openpcdet({"vfe.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="spatial_shape"):
        net(random_voxels(1, (4, 4, 4), (5,), 4, seed=14))


def test_second_first_layer_matches_dense():
    net = small_second()
    x = random_voxels(1, net.sparse_shape, (150,), 4, seed=15)
    y = net.conv_input(x)
    conv, bn = net.conv_input[0], net.conv_input[1]
    ref = F.conv3d(x.dense(), dense_weight(conv), None, padding=1)
    ref = torch.relu(F.batch_norm(ref, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps))
    torch.testing.assert_close(y.features, at(ref, x.indices))


def test_mean_vfe():
    from pcops.models.second import mean_vfe

    v = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]], [[5.0, 6.0], [0.0, 0.0], [0.0, 0.0]]])
    assert torch.equal(mean_vfe(v, torch.tensor([2, 1])), torch.tensor([[2.0, 3.0], [5.0, 6.0]]))


# --- static (fixed-capacity) form: padding rows, no host sync, capture ----------------------------


def with_padding(x, extra, seed):
    """``x`` plus ``extra`` padding rows (indices −1, random features) interleaved, as a static tensor."""
    g = generator(seed)
    n = x.indices.shape[0]
    order = torch.randperm(n + extra, generator=g)
    idx = torch.cat([x.indices, torch.full((extra, 4), -1, dtype=torch.int32)])[order]
    feats = torch.cat([x.features, torch.randn(extra, x.features.shape[1], generator=g, dtype=x.features.dtype)])
    return pnn.SparseConvTensor(feats[order], idx, x.spatial_shape, x.batch_size, static=True), order


def static_net():
    torch.manual_seed(0)
    return pnn.SparseSequential(
        pnn.SubMConv3d(3, 8, 3, indice_key="s1"),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        pnn.SparseConv3d(8, 8, 3, 2, 1, indice_key="d1"),
        torch.nn.BatchNorm1d(8),
        torch.nn.ReLU(),
        pnn.SubMConv3d(8, 8, 3, indice_key="s2"),
        pnn.SparseInverseConv3d(8, 4, 3, indice_key="d1"),
    ).double()


@pytest.mark.parametrize("training", [False, True])
def test_static_form_matches_the_variable_form(training):
    x = random_voxels(2, (7, 8, 9), (60, 35), 3, seed=16)
    xs, order = with_padding(x, 25, seed=17)
    net_a, net_b = static_net().train(training), static_net().train(training)
    y = net_a(x)
    ys = net_b(xs)
    assert ys.static and ys.features.shape[0] == xs.features.shape[0]
    # the static output's real rows are the input's real rows, in the padded order
    real = xs.valid
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    rows = inv[: x.indices.shape[0]]  # where each original row went
    torch.testing.assert_close(ys.features[rows], y.features)
    assert torch.equal(ys.indices[rows], y.indices) and int(real.sum()) == x.indices.shape[0]
    torch.testing.assert_close(ys.dense(), y.dense())
    for a, b in zip(net_a.modules(), net_b.modules()):  # masked BatchNorm: the same statistics
        if isinstance(a, torch.nn.BatchNorm1d):
            torch.testing.assert_close(a.running_mean, b.running_mean)
            torch.testing.assert_close(a.running_var, b.running_var)
    # the strided map kept its static form: N·J rows, the real ones first
    d1 = ys.indice_dict["d1"].kernel_map
    assert d1.out_coords.shape[0] == xs.indices.shape[0] * 8


def test_static_gradients_match():
    x = random_voxels(1, (6, 6, 6), (40,), 3, seed=18)
    xs, order = with_padding(x, 10, seed=19)
    fa = x.features.clone().requires_grad_(True)
    fb = xs.features.clone().requires_grad_(True)
    net_a, net_b = static_net().train(), static_net().train()
    ya = net_a(x.replace_feature(fa))
    yb = net_b(xs.replace_feature(fb))
    ya.features.square().sum().backward()
    (yb.features.square() * yb.valid[:, None]).sum().backward()
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    torch.testing.assert_close(fb.grad[inv[:40]], fa.grad)
    for pa, pb in zip(net_a.parameters(), net_b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad)


@pytest.mark.slow
def test_static_net_compiles_fullgraph():
    x = random_voxels(1, (6, 6, 6), (40,), 3, seed=18)
    xs, _ = with_padding(x, 10, seed=19)
    net = static_net().eval()

    def f(feats, idx):
        return net(pnn.SparseConvTensor(feats, idx, [6, 6, 6], 1, static=True)).features

    out = torch.compile(f, fullgraph=True)(xs.features, xs.indices)
    torch.testing.assert_close(out, f(xs.features, xs.indices))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_second_encoder_captured_in_one_graph():
    """SECOND's encoder in the static form on pad_to_max voxels: one CUDA graph, the same real
    rows as the eager variable form; the GPU kernel map treats padding rows as the CPU one does."""
    from pcops.models.second import VoxelBackBone8x, mean_vfe
    from pcops.sim import simulate_scan

    pts = simulate_scan(seed=5).points.cuda()
    v3 = dict(voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5)
    var = pcops.voxelize(pts, max_voxels=40000, **v3)
    pad = pcops.voxelize(pts, max_voxels=40000, pad_to_max=True, **v3)
    torch.manual_seed(0)
    net = VoxelBackBone8x(4, (1408, 1600, 40)).cuda().eval()
    with torch.no_grad():
        ref = net.forward_voxels(mean_vfe(var.voxels, var.num_points), var.coords, 1)["encoded_spconv_tensor"]
        feats = mean_vfe(pad.voxels, pad.num_points)

        def run():
            t = pnn.SparseConvTensor(feats, pad.coords, net.sparse_shape, 1, static=True)
            return net(t)["encoded_spconv_tensor"]

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = run()
        g.replay()
        torch.cuda.synchronize()
    m = ref.indices.shape[0]
    assert torch.equal(out.indices[:m], ref.indices) and bool((out.indices[m:] == -1).all())
    torch.testing.assert_close(out.features[:m], ref.features, atol=1e-4, rtol=1e-4)
    # padding rows on the GPU kernel map: -1 rows in out_in, as on the CPU
    c = torch.tensor([[0, 1, 1, 1], [-1, -1, -1, -1], [0, 2, 2, 2]], dtype=torch.int32)
    cpu = pcops.sparse_conv_kernel_map(c, (4, 4, 4), 3, subm=True, pad_pairs=True).out_in
    gpu = pcops.sparse_conv_kernel_map(c.cuda(), (4, 4, 4), 3, subm=True, pad_pairs=True).out_in
    assert torch.equal(gpu.cpu(), cpu)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_static_training_step_captured():
    """A training step (forward + backward, masked BatchNorm in training) of the static form in
    one CUDA graph: its gradients equal the eager variable form's (float32), and two replays give
    the same bits."""
    x = random_voxels(2, (12, 14, 16), (300, 200), 3, seed=31)
    xs, order = with_padding(x, 60, seed=32)
    net_a, net_b = static_net().float().cuda().train(), static_net().float().cuda().train()
    net_b.load_state_dict(net_a.state_dict())
    fa = x.features.float().cuda().requires_grad_(True)
    ya = net_a(pnn.SparseConvTensor(fa, x.indices.cuda(), x.spatial_shape, 2))
    ya.features.square().sum().backward()
    fb = xs.features.float().cuda().requires_grad_(True)
    idx = xs.indices.cuda()

    def step():
        yb = net_b(pnn.SparseConvTensor(fb, idx, xs.spatial_shape, 2, static=True))
        (yb.features.square() * yb.valid[:, None]).sum().backward()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            net_b.zero_grad(set_to_none=True)
            fb.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    net_b.zero_grad(set_to_none=True)
    fb.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    grads = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        grads.append([fb.grad.clone()] + [p.grad.clone() for p in net_b.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    torch.testing.assert_close(grads[0][0][inv[: x.indices.shape[0]].cuda()], fa.grad, atol=1e-4, rtol=1e-4)
    for pa, pb in zip(net_a.parameters(), grads[0][1:]):
        torch.testing.assert_close(pb, pa.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gpu_second_eager_graph_equals_op_by_op(dtype):
    """SECOND's encoder called eagerly on a simulated scan: the replayed graph gives the op-by-op
    outputs bit for bit, on a second scan too (one graph), and after an overflow."""
    from pcops.models import second
    from pcops.models.second import VoxelBackBone8x, mean_vfe
    from pcops.sim import simulate_scan

    v3 = dict(voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5)
    torch.manual_seed(0)
    net = VoxelBackBone8x(4, (1408, 1600, 40)).cuda().to(dtype).eval()
    ref_net = VoxelBackBone8x(4, (1408, 1600, 40), eager_graph=False).cuda().to(dtype).eval()
    ref_net.load_state_dict(net.state_dict())
    for seed in (5, 6):
        v = pcops.voxelize(simulate_scan(seed=seed).points.cuda(), max_voxels=40000, **v3)
        feats = mean_vfe(v.voxels, v.num_points).to(dtype)
        with torch.no_grad():
            out = net.forward_voxels(feats, v.coords, 1)
            ref = ref_net.forward_voxels(feats, v.coords, 1)
        assert_same_encoding(out, ref, exact=True)
    assert len(net._graphs) == 1
    small = VoxelBackBone8x(4, (1408, 1600, 40)).cuda().to(dtype).eval()
    small.load_state_dict(net.state_dict())
    factors = second._LEVEL_FACTORS
    try:
        second._LEVEL_FACTORS = (0.2, 0.2, 0.2, 0.2)
        with torch.no_grad():
            for _ in range(2):  # overflow: op by op; then a larger graph
                assert_same_encoding(small.forward_voxels(feats, v.coords, 1), ref, exact=True)
    finally:
        second._LEVEL_FACTORS = factors
    assert small._graph_caps and len(small._graphs) == 1


def test_static_capacity_keeps_the_first_rows_and_counts_the_rest():
    x = random_voxels(2, (7, 8, 9), (60, 35), 3, seed=20)
    xs, _ = with_padding(x, 5, seed=21)
    torch.manual_seed(0)
    conv = pnn.SparseConv3d(3, 4, 3, 2, 1, indice_key="d", capacity=10**6).double()
    full = conv(x)
    m = full.indices.shape[0]
    big = conv(xs)  # capacity above the real count: the variable form's rows, nothing dropped
    assert int(big.num_dropped) == 0 and big.indices.shape[0] == min(10**6, xs.indices.shape[0] * 8)
    torch.testing.assert_close(big.features[:m], full.features)
    conv.capacity = m - 7
    xs2, _ = with_padding(x, 5, seed=21)
    small = conv(xs2)
    assert small.indices.shape[0] == m - 7 and int(small.num_dropped) == 7
    assert torch.equal(small.indices, full.indices[: m - 7])
    torch.testing.assert_close(small.features, full.features[: m - 7])
    # an inverse conv after a capped conv maps back through the kept rows only
    up = pnn.SparseInverseConv3d(4, 2, 3, indice_key="d").double()
    back = up(small)
    assert torch.equal(back.indices, xs2.indices) and int(back.num_dropped) == 7
    with pytest.raises(ValueError, match="capacity"):
        pnn.SparseConv3d(3, 4, 3, 2, 1, capacity=0)


def test_second_static_capacity_matches_when_nothing_is_dropped():
    from pcops.models.second import VoxelBackBone8x

    torch.manual_seed(0)
    net = VoxelBackBone8x(4, grid_size=(24, 20, 40), static_capacity=3000).double().eval()  # > any grid's cells
    x = random_voxels(1, net.sparse_shape, (300,), 4, seed=22)
    xs, _ = with_padding(x, 20, seed=23)
    ref = net(x)["encoded_spconv_tensor"]
    out = net(xs)["encoded_spconv_tensor"]
    m = ref.indices.shape[0]
    assert out.indices.shape[0] <= 3000 and int(out.num_dropped) == 0
    assert torch.equal(out.indices[:m], ref.indices)
    torch.testing.assert_close(out.features[:m], ref.features)


def test_second_static_capacity_per_strided_conv():
    from pcops.models.second import VoxelBackBone8x

    net = VoxelBackBone8x(4, grid_size=(24, 20, 40), static_capacity=(50, 40, 30, 20))
    assert [c.capacity for c in net._strided()] == [50, 40, 30, 20]
    assert [c.capacity for c in VoxelBackBone8x(static_capacity=7)._strided()] == [7] * 4
    with pytest.raises(TypeError, match="static_capacity"):
        VoxelBackBone8x(static_capacity=(1, 2, 3))
    with pytest.raises(ValueError, match="static_capacity"):
        VoxelBackBone8x(static_capacity=(1, 2, 3, 0))
    with pytest.raises(TypeError, match="eager_graph"):
        VoxelBackBone8x(eager_graph=1)


class _ReplayGraph:
    """``torch.cuda.CUDAGraph`` on the CPU: ``replay()`` reruns the captured function and writes
    its results into the tensors the capture returned, as a replay overwrites its static outputs."""

    replays = 0

    def __init__(self, fn):
        self.fn = fn
        self.outputs = fn()

    def replay(self):
        _ReplayGraph.replays += 1
        (out, counts), (static, static_counts) = self.fn(), self.outputs
        pairs = list(zip(out["multi_scale_3d_features"].values(), static["multi_scale_3d_features"].values()))
        for new, old in pairs + [(out["encoded_spconv_tensor"], static["encoded_spconv_tensor"])]:
            old.features.copy_(new.features)
            old.indices.copy_(new.indices)
        static_counts.copy_(counts)


def _fake_capture(fn, device, warmup=2):
    g = _ReplayGraph(fn)
    return g, g.outputs


def assert_same_encoding(out, ref, exact=False):
    check = torch.equal if exact else lambda a, b: torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12) is None
    pairs = list(zip(out["multi_scale_3d_features"].values(), ref["multi_scale_3d_features"].values()))
    for a, b in pairs + [(out["encoded_spconv_tensor"], ref["encoded_spconv_tensor"])]:
        assert not a.static and a.spatial_shape == b.spatial_shape
        assert torch.equal(a.indices, b.indices) and check(a.features, b.features)


def test_second_eager_graph_bookkeeping(monkeypatch):
    """The eager graph's padding, counts, slicing, overflow fallback and recapture rules, run on
    the CPU with a stand-in graph that reruns the static form (the GPU test replays a real one)."""
    from pcops.models import graph as graph_mod
    from pcops.models import second

    monkeypatch.setattr(graph_mod, "capture_graph", _fake_capture)
    monkeypatch.setattr(
        second.VoxelBackBone8x, "_graph_applies", lambda self, x: self.eager_graph and not self.training
    )
    monkeypatch.setattr(second, "_GRAPH_ROWS", 64)
    monkeypatch.setattr(second, "_LEVEL_FACTORS", (4, 2, 1, 1))  # random voxels are denser than a scan's
    net, ref_net = small_second(), small_second()
    ref_net.eager_graph = False

    def voxels(seed, counts=(300, 200)):
        return random_voxels(2, net.sparse_shape, counts, 4, seed=seed)

    with torch.no_grad():
        ref = ref_net(voxels(40))
        out = net(voxels(40))
        assert_same_encoding(out, ref)
        (entry,) = net._graphs.values()
        assert entry.rows == 512 and entry.capacities == (2048, 1024, 512, 512) and int(entry.counts[-1]) == 0
        replays = _ReplayGraph.replays
        assert_same_encoding(net(voxels(41)), ref_net(voxels(41)))  # fewer voxels: the same graph
        assert _ReplayGraph.replays == replays + 1 and next(iter(net._graphs.values())) is entry
        assert_same_encoding(net(voxels(42, (400, 300))), ref_net(voxels(42, (400, 300))))  # more: captured again
        assert next(iter(net._graphs.values())).rows == 704
        with torch.no_grad():  # a parameter changes in place: captured again
            net.conv2[0][0].weight.mul_(0.5)
            ref_net.conv2[0][0].weight.mul_(0.5)
        assert_same_encoding(net(voxels(43)), ref_net(voxels(43)))
        # capacities too small: the call runs op by op, the next one captures larger capacities
        monkeypatch.setattr(second, "_LEVEL_FACTORS", (0.1, 0.1, 0.1, 0.1))
        small, ref_small = small_second(), small_second()
        ref_small.eager_graph = False
        assert_same_encoding(small(voxels(44)), ref_small(voxels(44)))
        asked = next(iter(small._graph_caps.values()))
        assert all(c % 64 == 0 for c in asked) and asked[0] > 64
        replays = _ReplayGraph.replays
        assert_same_encoding(small(voxels(44)), ref_small(voxels(44)))
        assert _ReplayGraph.replays == replays + 1 and next(iter(small._graphs.values())).capacities == asked
    # copies (fuse_for_inference, deepcopy) leave the graphs behind
    assert small._graphs and not copy.deepcopy(small)._graphs and not pnn.fuse_for_inference(small)._graphs
    # training mode and autograd take the op-by-op path
    small.train()
    small(voxels(45))
    assert _ReplayGraph.replays == replays + 1


# --- inference fusion: conv + BatchNorm + ReLU in one convolution ---------------------------------


def test_fuse_for_inference_second_encoder_matches():
    net = small_second()
    for m in net.modules():  # non-trivial affine parameters and conv biases too
        if isinstance(m, torch.nn.BatchNorm1d):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    fused = pnn.fuse_for_inference(net)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in fused.modules())
    convs = [m for m in fused.modules() if isinstance(m, sparse_mod._SparseConv3d)]
    assert len(convs) == len(OPENPCDET_KEYS) and all(c.activation == "relu" and c.bias is not None for c in convs)
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in net.modules())  # the input is untouched
    x = random_voxels(2, net.sparse_shape, (300, 200), 4, seed=31)
    a, b = net(x), fused(x)
    for key in ("x_conv1", "x_conv2", "x_conv3", "x_conv4"):
        torch.testing.assert_close(
            b["multi_scale_3d_features"][key].features, a["multi_scale_3d_features"][key].features
        )
    torch.testing.assert_close(b["encoded_spconv_tensor"].features, a["encoded_spconv_tensor"].features)
    with pytest.raises(ValueError, match="eval mode"):
        pnn.fuse_for_inference(small_second().train())


def test_fuse_for_inference_partial_runs_and_static_form():
    torch.manual_seed(3)
    net = pnn.SparseSequential(
        pnn.SubMConv3d(3, 6, 3, bias=True, indice_key="s1"),
        torch.nn.BatchNorm1d(6),  # conv + BN, no ReLU: folded, no epilogue
        pnn.SparseConv3d(6, 5, 3, 2, 1, indice_key="d1"),
        torch.nn.ReLU(),  # conv + ReLU without BN: left as it is
        pnn.SubMConv3d(5, 4, 3, indice_key="s2"),
        torch.nn.BatchNorm1d(4, affine=False),
        torch.nn.ReLU(),
    ).double()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.uniform_(-0.3, 0.3)
            m.running_var.uniform_(0.5, 2.0)
    net.eval()
    fused = pnn.fuse_for_inference(net)
    kinds = [type(m).__name__ for m in fused]
    assert kinds == ["SubMConv3d", "Identity", "SparseConv3d", "ReLU", "SubMConv3d", "Identity", "Identity"]
    assert [fused[i].activation for i in (0, 2, 4)] == [None, None, "relu"]
    x = random_voxels(2, (7, 8, 9), (60, 35), 3, seed=32)
    torch.testing.assert_close(fused(x).features, net(x).features)
    xs, _ = with_padding(x, 20, seed=33)  # the static form: the same real rows
    torch.testing.assert_close(fused(xs).dense(), net(xs).dense())
    with pytest.raises(TypeError, match="module"):
        pnn.fuse_for_inference("net")


def test_inference_weight_cache_follows_the_parameters():
    conv = make(pnn.SubMConv3d, 3, 5, 3, indice_key="c")
    x = random_voxels(1, (6, 7, 8), (50,), 3, seed=34)
    dense = lambda: at(F.conv3d(x.dense(), dense_weight(conv), conv.bias, padding=1), x.indices)  # noqa: E731
    with torch.no_grad():
        first = conv(x).features
        assert conv._gemm_cache is not None and torch.equal(conv(x).features, first)  # reused
        conv.weight.mul_(2)  # in place: a new version
        torch.testing.assert_close(conv(x).features, dense())
        conv.bias.add_(1)
        torch.testing.assert_close(conv(x).features, dense())
        conv.load_state_dict({"weight": torch.randn_like(conv.weight), "bias": torch.randn_like(conv.bias)})
        torch.testing.assert_close(conv(x).features, dense())
    y = conv(x)  # training path: no cache, differentiable
    y.features.sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0


# --- the SECOND detector (OpenPCDet second.yaml) ---------------------------------------------------


def test_second_detector_layout_and_full_size_config():
    from pcops.models.second import SECOND

    torch.manual_seed(0)
    m = SECOND()  # KITTI's second.yaml
    assert m.config.feature_map_hw == (200, 176) and m.num_anchors == 200 * 176 * 6
    assert m.backbone_3d.sparse_shape == [41, 1600, 1408] and m.backbone_3d.num_bev_features == 128 * 2
    sd = m.state_dict()
    shapes = {  # OpenPCDet's names and shapes for second.yaml's 2-D half
        "backbone_2d.blocks.0.1.weight": (128, 256, 3, 3),
        "backbone_2d.blocks.0.16.weight": (128, 128, 3, 3),
        "backbone_2d.blocks.1.1.weight": (256, 128, 3, 3),
        "backbone_2d.deblocks.0.0.weight": (128, 256, 1, 1),
        "backbone_2d.deblocks.1.0.weight": (256, 256, 2, 2),
        "dense_head.conv_cls.weight": (18, 512, 1, 1),
        "dense_head.conv_box.weight": (42, 512, 1, 1),
        "dense_head.conv_dir_cls.weight": (12, 512, 1, 1),
    }
    for k, shape in shapes.items():
        assert tuple(sd[k].shape) == shape, k
    assert {f"backbone_3d.{k}" for k in OPENPCDET_KEYS} <= set(sd)


@pytest.mark.slow  # one of the longest: the README's test command stays within 5 minutes
def test_second_detector_runs_and_loads_openpcdet_checkpoints():
    from pcops.models.second import SECOND, second_config

    cfg = second_config(point_cloud_range=(0.0, -8.0, -3.0, 12.8, 8.0, 1.0))
    torch.manual_seed(1)
    m = SECOND(cfg)
    for mod in m.modules():
        if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    with torch.no_grad():
        m.dense_head.conv_cls.bias.fill_(2.0)  # confident scores: detections to compare
    g = generator(35)
    pts = torch.rand(6000, 4, generator=g) * torch.tensor([12.8, 16.0, 3.0, 1.0]) - torch.tensor([0, 8.0, 2.5, 0])
    cls, box, dirc = m.dense_outputs(pts)
    assert cls.shape == (1, 40, 32, 18) and box.shape == (1, 40, 32, 42) and dirc.shape == (1, 40, 32, 12)
    det = m(pts)
    n = int(det.count[0])
    assert 0 < n <= cfg.nms_post_max_size and set(det.labels[0, :n].tolist()) <= {1, 2, 3}
    # an OpenPCDet checkpoint: DDP prefixes, spconv 1.x sparse weights, no global_step
    sd = m.state_dict()
    ckpt = {"model_state": {
        f"module.{k}": (v.permute(1, 2, 3, 4, 0) if k.startswith("backbone_3d") and v.dim() == 5 else v)
        for k, v in sd.items() if k != "global_step"}}  # fmt: skip
    torch.manual_seed(2)
    other = SECOND(cfg).load_openpcdet(ckpt)
    again = other(pts)
    assert torch.equal(again.count, det.count)
    torch.testing.assert_close(again.boxes, det.boxes)
    with pytest.raises(KeyError, match="missing"):
        SECOND(cfg).load_openpcdet({k: v for k, v in sd.items() if not k.startswith("dense_head")})
    bad = dict(sd)
    bad["dense_head.conv_cls.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="mis-shaped"):
        SECOND(cfg).load_openpcdet(bad)
    with pytest.raises(RuntimeError, match="eval mode"):
        SECOND(cfg).train()(pts)

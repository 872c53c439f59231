"""Data-parallel training, evaluation and inference (``pcops.models.distributed``; gloo on the CPU).

Fast tier: the pure pieces (environment, batch split, seeds, sampler, sharding, gather with world
size 1, SyncBatchNorm conversion, detection files, inference with world size 1). Slow tier: two
processes (``torch.multiprocessing.spawn`` with a free port, or ``torchrun`` for the CLI), one
thread each, a tiny simulated split and a small detection range.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from pcops.models import distributed as dd
from pcops.models.config import PointPillarsConfig
from pcops.models.data import EpochSampler
from pcops.models.pointpillars import PointPillars

REPO = Path(__file__).resolve().parents[1]
# a 128 x 128 grid away from the sensor, where no pillar of the test scans holds more than 128 points
# (101 measured; checked by the split fixture): the per-rank point shuffle then changes float rounding
# only, so one and two processes see the same pillars
SMALL = dict(
    point_cloud_range=(10.24, -10.24, -3.0, 30.72, 10.24, 1.0),
    max_points_per_voxel=128,
    max_voxels_train=4000,
    max_voxels_test=4000,
)


# --- fast tier: pure functions -----------------------------------------------------------------


def test_env_from_torchrun_variables():
    assert dd.env_from({}) == dd.DistEnv(0, 1, 0)
    env = dd.env_from({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (env.rank, env.world_size, env.local_rank, env.is_main, env.enabled) == (3, 4, 1, False, True)
    with pytest.raises(ValueError, match="RANK"):
        dd.env_from({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        dd.env_from({"WORLD_SIZE": "two"})
    assert dd.current() == dd.DistEnv()  # no process group in the test process


def test_split_batch_and_rank_seed():
    assert dd.split_batch(32, 1) == 32 and dd.split_batch(32, 8) == 4
    with pytest.raises(ValueError, match="batch_size"):
        dd.split_batch(30, 4)
    with pytest.raises(ValueError, match="world_size"):
        dd.split_batch(4, 0)
    assert dd.rank_seed(7, 0) == 7  # rank 0 is the single-process run
    seeds = {dd.rank_seed(s, r) for s in range(3) for r in range(4)}
    assert len(seeds) == 12


def test_distributed_sampler_splits_the_single_process_batches():
    n, batch, world = 23, 6, 3
    single = EpochSampler(n, seed=5)
    samplers = [dd.DistributedEpochSampler(n, 5, batch, r, world) for r in range(world)]
    assert all(isinstance(s, torch.utils.data.DistributedSampler) for s in samplers)
    for epoch in (0, 1):
        single.set_epoch(epoch)
        for s in samplers:
            s.set_epoch(epoch)
        ref = list(single)
        parts = [list(s) for s in samplers]
        assert all(len(p) == len(s) == (n // batch) * batch // world for p, s in zip(parts, samplers))
        for k in range(n // batch):
            got = sorted(x for p in parts for x in p[k * batch // world : (k + 1) * batch // world])
            assert got == sorted(ref[k * batch : (k + 1) * batch]), (epoch, k)
        assert all(e == epoch for p in parts for _, e in p)
    assert [i for i, _ in parts[0]] != [i for i, _ in dd.DistributedEpochSampler(n, 5, batch, 0, world)], "reshuffled"
    with pytest.raises(ValueError, match="batch_size"):
        dd.DistributedEpochSampler(n, 0, 5, 0, 2)


def test_shard_batches_whole_batches_in_order():
    n, b = 11, 3  # batches [0-2] [3-5] [6-8] [9-10]
    assert dd.shard_batches(n, b, 0, 1) == list(range(n))
    s0, s1 = dd.shard_batches(n, b, 0, 2), dd.shard_batches(n, b, 1, 2)
    assert s0 == [0, 1, 2, 6, 7, 8] and s1 == [3, 4, 5, 9, 10]
    assert dd.shard_batches(2, 4, 1, 2) == []  # more ranks than batches: an empty shard
    with pytest.raises(ValueError, match="rank"):
        dd.shard_batches(n, b, 2, 2)


def test_gather_ordered_world_size_one():
    from pcops.models.evaluate import SceneResult

    items = [(2, SceneResult(torch.ones(1, 7), torch.ones(1), ["Car"], torch.zeros(0, 7), [], torch.zeros(0)))]
    items.append((0, {"a": torch.arange(3)}))
    out = dd.gather_ordered(items)
    assert torch.equal(out[0]["a"], torch.arange(3)) and isinstance(out[1], SceneResult)
    with pytest.raises(ValueError, match="index"):
        dd.gather_ordered([(1, 0), (1, 1)])
    assert dd.all_reduce_mean(torch.ones(2)).tolist() == [1.0, 1.0] and dd.broadcast_object(5) == 5


@pytest.mark.slow  # one of the longest: the README's test command stays within 5 minutes
def test_sync_batchnorm_conversion_of_the_model():
    torch.manual_seed(0)
    model = PointPillars(config=PointPillarsConfig(**SMALL))
    bns = {n: type(m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    assert bns["vfe.pfn_layers.0.norm"] is nn.BatchNorm1d and nn.BatchNorm2d in bns.values()
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    pts = torch.rand(3000, 4) * torch.tensor([20.0, 20, 3, 1]) + torch.tensor([10.24, -10.0, -2.5, 0])
    model.eval()
    ref = model.forward_train(pts)
    dd.convert_sync_batchnorm(model)
    for n, m in model.named_modules():
        if n in bns:
            assert isinstance(m, dd.CpuSyncBatchNorm), n
    assert all(p is params[n] for n, p in model.named_parameters()), "parameters shared, not copied"
    assert list(model.state_dict()) == keys, "checkpoints keep their keys"
    torch.testing.assert_close(model.forward_train(pts).box_preds, ref.box_preds)  # eval: running statistics
    model.train()
    out = model.forward_train(pts)  # no process group: local statistics, as BatchNorm
    assert torch.isfinite(out.cls_preds).all()
    model.eval()
    dd.revert_sync_batchnorm(model)
    assert {n: type(m) for n, m in model.named_modules() if n in bns} == bns
    assert all(p is params[n] for n, p in model.named_parameters())
    model.weights_source = "test"
    assert model(pts).boxes.shape[1] == model.config.nms_post_max_size  # the fast path folds them again

    dd.convert_sync_batchnorm(model, cpu=False)  # CUDA: torch's SyncBatchNorm
    assert all(type(m) is nn.SyncBatchNorm for n, m in model.named_modules() if n in bns)
    dd.revert_sync_batchnorm(model)
    assert {n: type(m) for n, m in model.named_modules() if n in bns} == bns

    class MyBN(nn.BatchNorm2d):
        pass

    with pytest.raises(ValueError, match="MyBN"):
        dd.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(1, 2, 1), MyBN(2)))


def test_detection_files_round_trip(tmp_path):
    from pcops.models.data import SIM_CALIB
    from pcops.models.infer import DET_HEADER, read_detections, write_detections, write_kitti_detections

    boxes = torch.tensor([[12.3456, -3.21, -0.9, 3.9, 1.6, 1.56, 0.3], [20.0, 5.0, -1.0, 0.8, 0.6, 1.7, -2.0]])
    scores = torch.tensor([0.9123, 0.25])
    write_detections(tmp_path / "a.txt", boxes, scores, ["Car", "Pedestrian"])
    assert (tmp_path / "a.txt").read_text().splitlines()[0] == DET_HEADER
    b, s, n = read_detections(tmp_path / "a.txt")
    torch.testing.assert_close(b, boxes, atol=1e-4, rtol=0)
    torch.testing.assert_close(s, scores) and n == ["Car", "Pedestrian"]
    with pytest.raises(ValueError, match="scores"):
        write_detections(tmp_path / "b.txt", boxes, scores[:1], ["Car"])
    (tmp_path / "calib.txt").write_text(SIM_CALIB)
    write_kitti_detections(tmp_path / "k.txt", boxes, scores, ["Car", "Pedestrian"], tmp_path / "calib.txt")
    from pcops.io import read_kitti_label

    lines = (tmp_path / "k.txt").read_text().splitlines()
    assert len(lines) == 2 and lines[0].split()[-1] == "0.9123" and len(lines[0].split()) == 16
    (tmp_path / "k15.txt").write_text("".join(" ".join(ln.split()[:15]) + "\n" for ln in lines))
    back, names = read_kitti_label(tmp_path / "k15.txt", tmp_path / "calib.txt")
    assert names == ["Car", "Pedestrian"]
    torch.testing.assert_close(back, boxes, atol=2e-4, rtol=0)


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    from pcops.models.data import generate_split

    root = tmp_path_factory.mktemp("dist_sim")
    generate_split(root, n_train=4, n_val=5, workers=2, progress=False)
    _check_no_pillar_overflows(root)
    return root


def _check_no_pillar_overflows(root):
    """SMALL's premise: no pillar of the split holds more points than ``max_points_per_voxel``."""
    from pcops.io import read_points

    lo, hi = torch.tensor(SMALL["point_cloud_range"][:3]), torch.tensor(SMALL["point_cloud_range"][3:])
    size = torch.tensor(PointPillarsConfig(**SMALL).voxel_size[:2])
    for f in sorted((root / "training" / "velodyne").glob("*.bin")):
        xyz = read_points(f)[:, :3]
        xyz = xyz[((xyz >= lo) & (xyz < hi)).all(dim=1)]
        cell = ((xyz[:, :2] - lo[:2]) / size).long()
        most = int(torch.unique(cell, dim=0, return_counts=True)[1].max())
        assert most <= SMALL["max_points_per_voxel"], (f.name, most)


def test_infer_world_size_one(split, tmp_path):
    from pcops.io import read_points
    from pcops.models.infer import find_scans, infer, read_detections

    scans = find_scans(split, "val")[:2]
    assert [f for f, _, _ in scans] == ["000004", "000005"] and all(c is not None for _, _, c in scans)
    assert len(find_scans(split)) == 9  # no split: every scan of training/velodyne
    with pytest.raises(FileNotFoundError, match="split"):
        find_scans(split, "nope")
    model = PointPillars.pretrained()
    rec = infer(model, scans, tmp_path, batch_size=2, workers=0, kitti_labels=True, progress=False)
    assert rec["world_size"] == 1 and rec["per_rank"][0]["scans"] == 2 and rec["mode"] == "eager"
    det = model(read_points(scans[1][1]))
    b, s, n = read_detections(tmp_path / "000005.txt")
    k = int(det.count[0])
    assert len(n) == k > 0 and (tmp_path / "label_2" / "000005.txt").is_file()
    torch.testing.assert_close(b, det.boxes[0, :k], atol=1e-4, rtol=0)
    torch.testing.assert_close(s, det.scores[0, :k], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="batch_size"):
        infer(model, scans, tmp_path, batch_size=0)


# --- slow tier: several processes ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, job, kwargs):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    try:
        globals()[job](**kwargs)
    except BaseException:
        dd.cleanup(wait=False)
        raise
    dd.cleanup()


def _spawn(world: int, job: str, **kwargs) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world, _free_port(), job, kwargs), nprocs=world, join=True)


def _train_job(data, out, config, **cfg):
    from pcops.models.train import TrainConfig, train

    torch.manual_seed(0)
    base = dict(device="cpu", workers=0, eval_split=None, progress=False, log_every=1, precise_bn_batches=0)
    model = PointPillars(config=PointPillarsConfig(**config))
    import pcops.models.train as tr

    step_fn = tr.train_step

    def first_step_grads(model, batch, opt, sched, cfg, scaler=None, step=0, *args):
        losses = step_fn(model, batch, opt, sched, cfg, scaler, step, *args)
        if step == 0 and dd.current().is_main:  # gradients of the same weights (averaged by DDP, clipped)
            torch.save({n: p.grad for n, p in model.named_parameters()}, Path(out) / "grads.pt")
        return losses

    tr.train_step = first_step_grads
    try:
        train(TrainConfig(data=str(data), out=str(out), **{**base, **cfg}), model)
    finally:
        tr.train_step = step_fn


def _eval_job(data, out, batch_size):
    from pcops.models.train import evaluate_dataset

    dd.setup("cpu")
    res = evaluate_dataset(PointPillars.pretrained(), str(data), "val", batch_size, workers=0, progress=False)
    if dd.current().is_main:
        Path(out).write_text(json.dumps(res))


def _history(out):
    return json.loads((Path(out) / "train_result.json").read_text())["history"]


def _weights(out):
    return torch.load(Path(out) / "checkpoint.pt", weights_only=True)["model_state"]


@pytest.mark.slow
def test_two_processes_sync_bn_train_like_one_process(split, tmp_path):
    """2 ranks x 1 scan with SyncBatchNorm (the CPU path; the PFN's own statistics all-reduced)
    give the losses and gradients of 1 process x 2 scans, step by step (float rounding apart). A
    small learning rate: Adam's first steps move every weight by about lr whatever the size of its
    gradient, so rounding-level differences of near-zero gradients would grow into O(lr) weights."""
    run = dict(config=SMALL, batch_size=2, epochs=2, augment=False, sync_bn=True, lr=1e-5)
    _spawn(1, "_train_job", data=split, out=tmp_path / "one", **run)
    _spawn(2, "_train_job", data=split, out=tmp_path / "two", **run)
    one, two = _history(tmp_path / "one"), _history(tmp_path / "two")
    assert [h["step"] for h in two] == [1, 2, 3, 4]
    rec = json.loads((tmp_path / "two" / "train_result.json").read_text())
    assert rec["world_size"] == 2 and rec["batch_per_rank"] == 1
    for a, b in zip(one, two):
        for k in ("total", "cls", "loc", "dir"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k, a[k], b[k])
    ga, gb = torch.load(tmp_path / "one" / "grads.pt"), torch.load(tmp_path / "two" / "grads.pt")
    for k in ga:  # DDP's average of the per-rank gradients = the gradient of the whole batch
        # to float32 rounding: the single process's own gradients of the BatchNorm backbone differ from
        # float64 by up to ~1e-3 relative (measured), more in the first layers; the head's by ~1e-5
        scale, diff = float(ga[k].norm()), float((ga[k] - gb[k]).norm())
        assert diff <= (1e-3 if k.startswith("dense_head") else 3e-2) * scale + 1e-7, (k, scale, diff)
    wa, wb = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for k in ("vfe.pfn_layers.0.norm.running_mean", "backbone_2d.blocks.0.2.running_var"):
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-5)


@pytest.fixture(scope="module")
def straight(split, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    _spawn(2, "_train_job", data=split, out=out, config=SMALL, batch_size=2, epochs=2)
    return out


@pytest.mark.slow
def test_two_processes_resume_exactly(split, straight, tmp_path):
    run = dict(data=split, config=SMALL, batch_size=2, epochs=2)
    _spawn(2, "_train_job", out=tmp_path / "a", max_steps=2, **run)  # epoch 1 of 2, then a checkpoint
    _spawn(2, "_train_job", out=tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint.pt"), **run)
    resumed, full = _history(tmp_path / "b"), _history(straight)
    assert [h["step"] for h in resumed] == [3, 4]
    assert [h["total"] for h in resumed] == [h["total"] for h in full[2:]]  # bit-identical on the CPU
    wa, wb = _weights(straight), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_two_processes_are_deterministic(split, straight, tmp_path):
    _spawn(2, "_train_job", data=split, out=tmp_path / "again", config=SMALL, batch_size=2, epochs=2)
    assert [h["total"] for h in _history(tmp_path / "again")] == [h["total"] for h in _history(straight)]
    wa, wb = _weights(straight), _weights(tmp_path / "again")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_distributed_evaluation_equals_single_process(split, tmp_path):
    _spawn(1, "_eval_job", data=split, out=tmp_path / "one.json", batch_size=2)
    _spawn(2, "_eval_job", data=split, out=tmp_path / "two.json", batch_size=2)  # batches of 2, 2, 1 scans
    one, two = json.loads((tmp_path / "one.json").read_text()), json.loads((tmp_path / "two.json").read_text())
    assert one["num_scans"] == 5 and one["Car"]["num_gt"] > 0
    assert two == one


@pytest.mark.slow
def test_torchrun_infer_cli_equals_one_process(split, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["infer", "--data", str(split), "--split", "val", "--device", "cpu", "--workers", "0", "--no-progress"]
    one = subprocess.run(
        [sys.executable, "-m", "pcops.models", *args, "--out", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}"]
        + ["-m", "pcops.models", *args, "--out", str(tmp_path / "two")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr
    rec = json.loads(two.stdout)
    assert rec["world_size"] == 2 and [r["scans"] for r in rec["per_rank"]] == [3, 2]
    files = sorted(p.name for p in (tmp_path / "one").glob("*.txt"))
    assert files == [f"00000{i}.txt" for i in range(4, 9)]
    assert all((tmp_path / "one" / f).read_text() == (tmp_path / "two" / f).read_text() for f in files)

"""Training and evaluation loops of PointPillars (OpenPCDet's KITTI recipe on one device).

Recipe (``pointpillar.yaml``): AdamW-style Adam (decoupled weight decay 0.01, β = (0.95, 0.99)),
one-cycle schedule (max lr 0.003, warm-up 40 % from lr/10 by cosine, then cosine down to
lr/10/1e4, β₁ cycled 0.95 → 0.85 → 0.95), gradient-norm clip 10, OpenPCDet's batch of 32 scans
(4 per GPU × 8 GPUs) on one device, ``max_voxels_train`` 16,000 pillars per scan. Deviations:
fewer epochs (the schedule is compressed, not cut: one-cycle over the run), bf16 autocast on
CUDA (no loss scaler needed for bf16; fp16 uses ``torch.amp.GradScaler``), and the target
assignment/augmentations batched on the GPU (same rules, see ``targets.py`` and ``data.py``).

Determinism: the data order, the augmentation draws and the point shuffle are functions of the
seed, the epoch and the step, so a run resumed from a checkpoint replays the same batches. On the
CPU a run is bit-reproducible; on CUDA cuDNN's convolution backward and the scatter of the
pillars are not bit-reproducible unless ``deterministic=True`` (``torch.backends.cudnn.deterministic``,
slower), so two GPU runs agree to float rounding only.

Several processes (``torchrun --nproc_per_node=N``): ``DistributedDataParallel``, the total batch
split over the ranks, optional SyncBatchNorm, rank-0 logging and checkpoints, per-rank seeds; see
:mod:`pcops.models.distributed`. World size 1 runs the single-process code unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import distributed as dd
from . import evaluate as ev
from .augment import SensorAug, augment_batch
from .data import Batch, EpochSampler, KittiDataset, _progress, collate
from .loss import pointpillars_loss
from .pointpillars import PointPillars
from .targets import assign_targets

__all__ = ["TrainConfig", "train", "evaluate_dataset", "export_weights"]

log = logging.getLogger("pcops.models")


# steps over which a --time-budget run measures its step time (after the profiled steps 30-49)
FIT_WINDOW = (50, 70)
# fractions of a --time-budget at which the run measures its pace again (wall time per step since
# the last fit, loader waits included: the loader's prefetched batches hide a slow loader from the
# first fit) and fits the schedule again when the planned end moves by more than REFIT_TOLERANCE
REFIT_AT = (0.35, 0.65, 0.85)
REFIT_TOLERANCE = 0.01


@dataclass(frozen=True)
class TrainConfig:
    """Options of :func:`train` (the command line's ``train`` flags, in ``--kebab-case``)."""

    data: str  # KITTI-format folder
    out: str = "out/train"  # checkpoints, logs, results
    epochs: int = 40
    batch_size: int = 32
    lr: float = 0.003
    weight_decay: float = 0.01
    moms: tuple = (0.95, 0.85)
    pct_start: float = 0.4
    div_factor: float = 10.0
    grad_clip: float = 10.0
    amp: str = "bf16"  # "bf16", "fp16" or "none" (CUDA only; the CPU runs float32)
    workers: int = 8
    seed: int = 0
    device: str = "cuda"
    max_steps: int | None = None  # stop after this many steps (smoke tests; the schedule keeps its length)
    checkpoint_every: int = 1  # epochs
    resume: str | None = None
    eval_split: str | None = "val"
    augment: bool = True  # OpenPCDet's augmentations (off: the scans as they are, e.g. to overfit a few)
    sensor_aug: bool = False  # also augment.SensorAug (object scale, beam dropout, reflectance, sensor height)
    eval_batch_size: int = 16
    deterministic: bool = False
    progress: bool = True
    log_every: int = 20
    time_budget: float | None = None  # seconds of training: the schedule is fitted at step FIT_WINDOW[1], then REFIT_AT
    precise_bn_batches: int = 20  # re-estimate BatchNorm statistics over this many batches at the end (0: off)
    sync_bn: bool = False  # several processes: SyncBatchNorm (statistics of the global batch)
    dist_backend: str | None = None  # several processes: "nccl" / "gloo" (default: NCCL on CUDA, gloo on CPU)


def _loader(ds, batch_size: int, sampler, workers: int, device: str, drop_last: bool):
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=device.startswith("cuda"),
        drop_last=drop_last,
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
    )


def _one_cycle(opt, cfg: TrainConfig, total_steps: int):
    """OpenPCDet's one-cycle: cosine warm-up from lr/div to lr over pct_start, then down to lr/div/1e4;
    β₁ cycled the other way. One spare step so that the last training step stays inside the schedule."""
    return torch.optim.lr_scheduler.OneCycleLR(
        opt,
        max_lr=cfg.lr,
        total_steps=total_steps + 1,
        pct_start=cfg.pct_start,
        anneal_strategy="cos",
        cycle_momentum=True,
        base_momentum=cfg.moms[1],
        max_momentum=cfg.moms[0],
        div_factor=cfg.div_factor,
        final_div_factor=1e4,
    )


def _build_optimizer(model, cfg: TrainConfig, total_steps: int):
    fused = cfg.device.startswith("cuda")
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr / cfg.div_factor,
        betas=(cfg.moms[0], 0.99),
        weight_decay=cfg.weight_decay,
        fused=fused,
    )
    sched = _one_cycle(opt, cfg, total_steps)
    return opt, sched


def _mark(times, name, device):
    if times is not None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((name, time.perf_counter()))


def _refit_schedule(model, opt, cfg: TrainConfig, total_steps: int, step: int):
    """A one-cycle schedule over ``total_steps`` advanced to ``step`` (the optimizer state is kept)."""
    sched = _one_cycle(opt, cfg, total_steps)
    for _ in range(step):
        sched.step()
    return opt, sched


def train_step(
    model: PointPillars,
    batch: Batch,
    opt,
    sched,
    cfg: TrainConfig,
    scaler=None,
    step: int = 0,
    times: list | None = None,
    forward=None,
    rank: int = 0,
):
    """One optimisation step on a batch already on the device; returns the (device) losses.
    ``times``: a list to receive ``(stage, perf_counter)`` marks (synchronising: profiling only).
    ``forward``: what computes the head outputs (default ``model.forward_train``; the
    ``DistributedDataParallel`` wrapper under several processes); ``rank``: seeds the point shuffle."""
    device = batch.points.device
    _mark(times, "start", device)
    gen = torch.Generator(device=device).manual_seed(dd.rank_seed(cfg.seed, rank) * 1_000_003 + step)
    sensor = SensorAug() if cfg.sensor_aug and cfg.augment else None
    batch = augment_batch(batch, model.config, generator=gen, sensor=sensor)
    _mark(times, "augment", device)
    amp = device.type == "cuda" and cfg.amp != "none"
    dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
    with torch.autocast(device.type, dtype=dtype, enabled=amp):
        preds = (forward or model.forward_train)(batch.points, batch.lengths)
    _mark(times, "forward", device)
    anchors = model.anchors(device)
    targets = assign_targets(
        model.config, anchors, batch.gt_boxes, batch.gt_labels, class_slices=batch.class_slices or None
    )
    losses = pointpillars_loss(model.config, preds, targets, anchors)
    _mark(times, "targets+loss", device)
    opt.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.scale(losses.total).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        scaler.step(opt)
        scaler.update()
    else:
        losses.total.backward()
        _mark(times, "backward", device)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip, foreach=True)
        opt.step()
    sched.step()
    model.global_step += 1
    _mark(times, "clip+optimizer", device)
    return losses


def _save(
    path: Path,
    model,
    opt,
    sched,
    epoch: int,
    step: int,
    cfg: TrainConfig,
    scaler=None,
    world: int = 1,
    total_steps=None,
) -> None:
    if not dd.current().is_main:
        return
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model_state": model.state_dict(),
            "optimizer_state": opt.state_dict(),
            "scheduler_state": sched.state_dict(),
            "scaler_state": None if scaler is None else scaler.state_dict(),
            "epoch": epoch,
            "step": step,
            "train_config": dataclasses.asdict(cfg),
            "world_size": world,
            "total_steps": total_steps,  # the schedule's length (fitted to a time budget, or epochs' steps)
        },
        tmp,
    )
    os.replace(tmp, path)


def export_weights(model: PointPillars, path) -> int:
    """Save the weights for shipping: float16 parameters, float32 BatchNorm statistics (their range
    needs it); returns the file size in bytes. Loads with :meth:`PointPillars.pretrained`."""
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().cpu()
        if v.is_floating_point() and "running_" not in k:
            v = v.half()
        state[k] = v
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path.stat().st_size


def train(cfg: TrainConfig, model: PointPillars | None = None) -> dict:
    """Train on ``cfg.data``'s train split, checkpoint every ``checkpoint_every`` epochs into
    ``cfg.out``, evaluate on ``cfg.eval_split`` at the end; returns the run's record (also written to
    ``out/train_result.json``). Under torchrun, every rank runs it (see :mod:`pcops.models.distributed`)."""
    env, dev_name = dd.setup(cfg.device, cfg.dist_backend)
    per_rank = dd.split_batch(cfg.batch_size, env.world_size)
    torch.manual_seed(dd.rank_seed(cfg.seed, env.rank))
    device = torch.device(dev_name)
    if cfg.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True
    out = Path(cfg.out)
    if env.is_main:
        out.mkdir(parents=True, exist_ok=True)
    model = (model or PointPillars()).to(device)
    progress = cfg.progress and env.is_main
    mcfg = model.config
    ds = KittiDataset(cfg.data, "train", mcfg, augment=cfg.augment, seed=cfg.seed)
    steps_per_epoch = len(ds) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"batch_size: {cfg.batch_size} is larger than the {len(ds)} training scans")
    total_steps = steps_per_epoch * cfg.epochs  # the schedule's length
    opt, sched = _build_optimizer(model, cfg, total_steps)
    stop_at = total_steps if cfg.max_steps is None else min(total_steps, cfg.max_steps)  # max_steps stops early only
    t_fit = None  # start of the step-time measurement of a --time-budget run (steps FIT_WINDOW)
    pace = None  # (time, step) of the last fit: where the next measurement of the pace starts
    refits = list(REFIT_AT)
    max_total = total_steps  # the epochs asked for: a re-fit never plans past them
    scaler = torch.amp.GradScaler("cuda") if (device.type == "cuda" and cfg.amp == "fp16") else None
    start_epoch, step = 0, 0
    if cfg.resume:
        ck = torch.load(cfg.resume, map_location="cpu", weights_only=True)
        model.load_state_dict(ck["model_state"])
        opt.load_state_dict(ck["optimizer_state"])
        sched.load_state_dict(ck["scheduler_state"])
        if scaler is not None and ck.get("scaler_state"):
            scaler.load_state_dict(ck["scaler_state"])
        start_epoch, step = int(ck["epoch"]), int(ck["step"])
        if ck.get("total_steps") is not None:  # a schedule fitted to a time budget keeps its length
            total_steps = int(ck["total_steps"])
            stop_at = total_steps if cfg.max_steps is None else min(total_steps, cfg.max_steps)
        if cfg.time_budget and step >= FIT_WINDOW[0]:
            log.warning(
                "resume at step %d: the schedule keeps the checkpoint's length; --time-budget is fitted only "
                "by a run that passes steps %d-%d",
                step,
                *FIT_WINDOW,
            )
        if int(ck.get("world_size", 1)) != env.world_size:
            log.warning(
                "resume: the checkpoint was written by %d processes, this run has %d: the run continues, "
                "but not as the original would have (other per-rank batches and point shuffles)",
                int(ck.get("world_size", 1)),
                env.world_size,
            )
    model.train()
    forward = None
    if env.enabled:
        if cfg.sync_bn:
            dd.convert_sync_batchnorm(model)
        ddp_kwargs = {"device_ids": [device.index]} if device.type == "cuda" else {}
        forward = torch.nn.parallel.DistributedDataParallel(dd.TrainForward(model), **ddp_kwargs)
        sampler = dd.DistributedEpochSampler(
            len(ds), cfg.seed, cfg.batch_size, env.rank, env.world_size, shuffle=True, start_epoch=start_epoch
        )
    else:
        sampler = EpochSampler(len(ds), cfg.seed, shuffle=True, start_epoch=start_epoch)
    loader = _loader(ds, per_rank, sampler, cfg.workers, dev_name, drop_last=True)
    timing = {"data_wait_s": 0.0, "steps": 0}
    profile: dict = {}  # stage -> seconds over the profiled steps (synchronised; steps 30-49 of the run)
    history = []
    t_start = time.perf_counter()
    done = step >= stop_at
    epoch = start_epoch
    while not done and epoch < cfg.epochs:
        sampler.set_epoch(epoch)
        bar = _progress(iter(loader), steps_per_epoch, f"epoch {epoch + 1}/{cfg.epochs}", progress)
        t_epoch = time.perf_counter()
        t_data = time.perf_counter()
        for batch in bar:
            batch = batch.to(device)
            t0 = time.perf_counter()
            timing["data_wait_s"] += t0 - t_data
            marks = [] if 30 <= step < 50 else None
            losses = train_step(model, batch, opt, sched, cfg, scaler, step, marks, forward, env.rank)
            if marks:
                for (_, a), (name, b) in zip(marks, marks[1:]):
                    profile[name] = profile.get(name, 0.0) + b - a
                profile["data (wait for the loader)"] = profile.get("data (wait for the loader)", 0.0) + t0 - t_data
                profile["steps"] = profile.get("steps", 0) + 1
            step += 1
            if step % cfg.log_every == 0 or step == stop_at:
                keys = ("total", "cls", "loc", "dir")
                if env.enabled:  # the mean over the ranks: the loss of the global batch
                    mean = dd.all_reduce_mean(torch.stack([getattr(losses, k).detach().float() for k in keys]))
                    losses = losses._replace(**dict(zip(keys, mean.unbind())))
                vals = {k: float(getattr(losses, k).detach()) for k in keys}  # one sync
                vals.update(
                    step=step,
                    epoch=epoch,
                    lr=sched.get_last_lr()[0],
                    scans_per_s=cfg.batch_size * step / max(time.perf_counter() - t_start, 1e-9),
                )
                history.append(vals)
                if hasattr(bar, "set_postfix"):
                    bar.set_postfix(
                        loss=f"{vals['total']:.3f}", lr=f"{vals['lr']:.2e}", scans_s=f"{vals['scans_per_s']:.0f}"
                    )
                if not math.isfinite(vals["total"]):
                    raise FloatingPointError(f"loss is {vals['total']} at step {step}")
            timing["steps"] += 1
            if cfg.time_budget and step == FIT_WINDOW[0]:
                t_fit = time.perf_counter()
            if cfg.time_budget and step == FIT_WINDOW[1] and t_fit is not None:
                # fit the one-cycle schedule to the budget from the step time measured after the
                # warm-up and after the profiled (synchronising) steps 30-49
                per_step = (time.perf_counter() - t_fit) / (FIT_WINDOW[1] - FIT_WINDOW[0])
                fit = step + int((cfg.time_budget - (time.perf_counter() - t_start)) / per_step)
                per_step, fit = dd.broadcast_object((per_step, fit))  # rank 0's measurement: one schedule
                pace = (time.perf_counter(), step)
                if fit < total_steps:
                    total_steps = max(fit, step + 1)
                    stop_at = min(stop_at, total_steps)
                    opt, sched = _refit_schedule(model, opt, cfg, total_steps, step)
                    log.info(
                        "time budget %.0f s: %.1f ms per step, schedule fitted to %d steps (%.1f epochs)",
                        cfg.time_budget,
                        1000 * per_step,
                        total_steps,
                        total_steps / steps_per_epoch,
                    )
            elif cfg.time_budget and pace is not None and refits and step - pace[1] >= 20 and step % 20 == 0:
                now = time.perf_counter()
                go = dd.broadcast_object(now - t_start >= refits[0] * cfg.time_budget)  # rank 0's clock
                if go:
                    del refits[0]
                    per_step = (now - pace[0]) / (step - pace[1])
                    fit = step + int((cfg.time_budget - (now - t_start)) / per_step)
                    per_step, fit = dd.broadcast_object((per_step, min(max(fit, step + 1), max_total)))
                    pace = (now, step)
                    if abs(fit - total_steps) > REFIT_TOLERANCE * total_steps:
                        log.info(
                            "time budget %.0f s: %.1f ms per step since the last fit, schedule refitted from "
                            "%d to %d steps",
                            cfg.time_budget,
                            1000 * per_step,
                            total_steps,
                            fit,
                        )
                        total_steps = fit
                        stop_at = total_steps if cfg.max_steps is None else min(total_steps, cfg.max_steps)
                        opt, sched = _refit_schedule(model, opt, cfg, total_steps, step)
            t_data = time.perf_counter()
            if step >= stop_at:
                done = True
                break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if env.is_main:
            log.info("epoch %d: %.1f s", epoch + 1, time.perf_counter() - t_epoch)
        epoch += 1
        if epoch % cfg.checkpoint_every == 0 or done:
            _save(out / "checkpoint.pt", model, opt, sched, epoch, step, cfg, scaler, env.world_size, total_steps)
    if cfg.precise_bn_batches and step > 0:
        recalibrate_batchnorm(model, loader, sampler, epoch, cfg.precise_bn_batches, device)
        if not cfg.sync_bn:
            dd.average_batchnorm_stats(model)  # each rank recalibrated on its own batches
    if env.enabled:
        dd.revert_sync_batchnorm(model)  # the fast inference path folds plain BatchNorm
        dd.broadcast_module_state(model)  # rank 0's buffers (DDP broadcasts them at each forward)
    train_s = time.perf_counter() - t_start
    model.eval()
    model.weights_source = f"trained: {cfg.data}, {step} steps"
    record = {
        "train_config": dataclasses.asdict(cfg),
        "steps": step,
        "epochs_done": round(step / steps_per_epoch, 2),
        "train_seconds": round(train_s, 1),
        "scans_per_s": round(cfg.batch_size * max(step - (0 if not cfg.resume else 0), 1) / max(train_s, 1e-9), 1),
        "world_size": env.world_size,
        "batch_per_rank": per_rank,
        "history": history[-50:],
        "data_wait_s": round(timing["data_wait_s"], 2),
        "step_ms_profiled": {
            k: round(1000 * v / max(profile.get("steps", 1), 1), 2) for k, v in profile.items() if k != "steps"
        },
    }
    if cfg.eval_split:
        t_eval = time.perf_counter()
        record["eval"] = evaluate_dataset(model, cfg.data, cfg.eval_split, cfg.eval_batch_size, cfg.workers, progress)
        record["eval_seconds"] = round(time.perf_counter() - t_eval, 1)
        record["time_to_accuracy_s"] = round(time.perf_counter() - t_start, 1)
    if env.is_main:
        (out / "train_result.json").write_text(json.dumps(record, indent=1))
    return record


@torch.no_grad()
def recalibrate_batchnorm(model: PointPillars, loader, sampler, epoch: int, n_batches: int, device) -> None:
    """Precise BatchNorm (Wu & Johnson 2021): recompute every BatchNorm's running statistics as the
    plain average over ``n_batches`` augmented training batches with the final weights. With
    OpenPCDet's momentum of 0.01 the running statistics trail the weights by ~100 steps, which
    matters on a short schedule; this is a deviation from OpenPCDet's recipe."""
    from torch import nn

    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    sampler.set_epoch(epoch + 1000)
    try:
        for i, batch in enumerate(loader):
            if i >= n_batches:
                break
            batch = augment_batch(batch.to(device), model.config)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                model.forward_train(batch.points, batch.lengths)
    finally:
        for bn, mom in zip(bns, saved):
            bn.momentum = mom


@torch.no_grad()
def evaluate_dataset(
    model: PointPillars,
    data: str,
    split: str = "val",
    batch_size: int = 16,
    workers: int = 4,
    progress: bool = True,
    max_scans: int | None = None,
) -> dict:
    """Detect on every scan of a KITTI-format split and compute :func:`pcops.models.evaluate.evaluate`.

    Under a process group of several ranks (torchrun), each rank detects on whole batches of the
    single-process order (:func:`~pcops.models.distributed.shard_batches`), the per-scan results are
    gathered in scan order (``all_gather_object``), rank 0 computes the AP and every rank returns it:
    the result equals the single-process evaluation with the same ``batch_size``."""
    model.eval()
    device = next(model.parameters()).device
    env = dd.current()
    ds = KittiDataset(data, split, model.config, augment=False)
    n = len(ds) if max_scans is None else min(max_scans, len(ds))
    mine = dd.shard_batches(n, batch_size, env.rank, env.world_size)
    sub = torch.utils.data.Subset(ds, mine)
    loader = torch.utils.data.DataLoader(sub, batch_size=batch_size, num_workers=workers, collate_fn=_eval_collate)
    scenes = []
    progress = progress and env.is_main
    warn = model.warn_on_dropped_voxels
    model.warn_on_dropped_voxels = False
    try:
        for items, batch in _progress(loader, math.ceil(len(mine) / batch_size), f"evaluate {split}", progress):
            pts = batch.points.to(device, non_blocking=True)
            lengths = batch.lengths.to(device)
            det = model(pts, lengths)
            gts = []
            start = 0
            for b, it in enumerate(items):
                boxes = torch.cat([it["boxes"], it["ignore_boxes"]]).to(device)
                names = [model.config.class_names[i - 1] for i in it["labels"].tolist()] + list(it["ignore_names"])
                npts = ev.count_points_in_boxes(pts[start : start + int(batch.lengths[b])], boxes)
                start += int(batch.lengths[b])
                gts.append((boxes, names, npts))
            scenes += ev.detections_to_scenes(det, model.config.class_names, gts)
    finally:
        model.warn_on_dropped_voxels = warn
    if env.enabled:
        scenes = dd.gather_ordered(list(zip(mine, scenes)), device if env.is_main else "cpu")
        result = None
        if env.is_main:
            result = ev.evaluate(scenes, model.config.class_names, point_cloud_range=model.config.point_cloud_range)
        result = dd.broadcast_object(result)
    else:
        result = ev.evaluate(scenes, model.config.class_names, point_cloud_range=model.config.point_cloud_range)
    result["num_scans"] = n
    return result


def _eval_collate(items):
    return items, collate(items)

"""Data parallelism for training, evaluation and inference: ``torchrun`` and ``torch.distributed``.

``python -m pcops.models train|evaluate|infer`` run unchanged under ``torchrun --nproc_per_node=N``:
:func:`setup` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), starts the
process group (NCCL on CUDA, gloo on the CPU; ``--dist-backend`` overrides) and picks the rank's
device (``cuda:LOCAL_RANK``). Without those variables (a plain ``python -m ...``) nothing changes:
world size 1, no process group, the single-device code path.

Training (:func:`pcops.models.train.train`): ``DistributedDataParallel`` around :class:`TrainForward`
(a module whose ``forward`` is :meth:`PointPillars.forward_train`), :class:`DistributedEpochSampler`
(a ``DistributedSampler``: each global batch of ``batch_size`` scans is the one a single process
would draw, split over the ranks), ``batch_size / world_size`` scans per rank. Seeds: the data
order and the per-scan augmentation draws (ground-truth sampling, flip, rotation, scaling) depend on
the seed, the epoch and the scan only, so they do not depend on the world size; the point shuffle
and the torch RNG of rank ``r`` use :func:`rank_seed` (``seed + r * 2**32``; rank 0 is the seed
itself), so a run is reproducible for a given world size (bit-identical on the CPU).

SyncBatchNorm (``--sync-bn``): :func:`convert_sync_batchnorm` converts every BatchNorm with torch's
``SyncBatchNorm.convert_sync_batchnorm`` (on the CPU, where torch's raises and DDP refuses it, on to
:class:`CpuSyncBatchNorm`: the statistics all-reduced through autograd-aware collectives), and the
pillar feature net's own statistics path (:meth:`PillarVFE.forward_train`, which computes the
moments itself) all-reduces its moments when its BatchNorm is a ``SyncBatchNorm``.
:func:`revert_sync_batchnorm` restores the original classes (the fast inference path folds plain
BatchNorm only); the parameters and statistics are shared, so nothing is copied.

Evaluation and inference: :func:`shard_batches` gives each rank whole batches of the
single-process order (batch ``k`` to rank ``k mod world_size``), so every batch, and with it every
detection, is the one the single process computes; :func:`gather_ordered` collects the per-scan
results with ``all_gather_object`` and puts them back in scan order.
"""

from __future__ import annotations

import gc

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "DistEnv",
    "env_from",
    "current",
    "setup",
    "cleanup",
    "split_batch",
    "rank_seed",
    "DistributedEpochSampler",
    "shard_batches",
    "gather_ordered",
    "all_reduce_mean",
    "broadcast_object",
    "broadcast_module_state",
    "average_batchnorm_stats",
    "TrainForward",
    "CpuSyncBatchNorm",
    "convert_sync_batchnorm",
    "revert_sync_batchnorm",
    "sync_group",
]

log = logging.getLogger("pcops.models")

RANK_SEED_STRIDE = 2**32  # rank r's seed: seed + r * stride (distinct from every 32-bit user seed)


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands: ``rank`` of ``world_size`` processes, ``local_rank`` on its host."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _int_var(environ, name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer in the environment, got {raw!r}") from None


def env_from(environ=None) -> DistEnv:
    """The :class:`DistEnv` described by torchrun's variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``) in ``environ`` (default ``os.environ``); world size 1 when they are absent."""
    environ = os.environ if environ is None else environ
    world = _int_var(environ, "WORLD_SIZE", 1)
    rank = _int_var(environ, "RANK", 0)
    local = _int_var(environ, "LOCAL_RANK", rank)
    if world < 1:
        raise ValueError(f"WORLD_SIZE: expected >= 1, got {world}")
    if not 0 <= rank < world:
        raise ValueError(f"RANK: expected 0 <= RANK < WORLD_SIZE={world}, got {rank}")
    if local < 0:
        raise ValueError(f"LOCAL_RANK: expected >= 0, got {local}")
    return DistEnv(rank, world, local)


def current() -> DistEnv:
    """The running process group's :class:`DistEnv` (world size 1 when none is initialised)."""
    if dist.is_available() and dist.is_initialized():
        env = env_from()
        return DistEnv(dist.get_rank(), dist.get_world_size(), env.local_rank)
    return DistEnv()


def setup(device: str = "cuda", backend: str | None = None) -> tuple[DistEnv, str]:
    """Start the process group when launched by torchrun (``WORLD_SIZE > 1``) and pick the rank's
    device; returns ``(env, device)``. A process group started by the caller is used as it is.
    ``backend``: ``"nccl"``, ``"gloo"`` or None (NCCL for CUDA, gloo for the CPU)."""
    if backend not in (None, "nccl", "gloo", "mpi", "ucc"):
        raise ValueError(f"backend: expected 'nccl', 'gloo', 'mpi', 'ucc' or None, got {backend!r}")
    env = env_from()
    dev = torch.device(device)
    if dist.is_available() and dist.is_initialized():
        env = current()
    elif env.enabled:
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("device: 'cuda' requested under torchrun, but no CUDA device is available")
            if env.local_rank >= torch.cuda.device_count():
                raise ValueError(
                    f"LOCAL_RANK: {env.local_rank} but only {torch.cuda.device_count()} CUDA devices "
                    "(use --nproc_per_node <= the GPUs of the host)"
                )
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        if backend == "nccl" and dev.type != "cuda":
            raise ValueError(f"backend: 'nccl' needs CUDA tensors, but the device is {device!r} (use gloo)")
        kwargs = {"device_id": torch.device("cuda", env.local_rank)} if backend == "nccl" else {}
        if dev.type == "cuda":
            torch.cuda.set_device(env.local_rank)
        dist.init_process_group(backend=backend, **kwargs)
    if dev.type == "cuda" and env.enabled:
        torch.cuda.set_device(env.local_rank)
        device = f"cuda:{env.local_rank}"
    if not env.is_main:  # rank-0 logging: the other ranks report warnings and errors only
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
    return env, device


def cleanup(wait: bool = True) -> None:
    """Destroy the process group if one is running (the end of a torchrun command).

    ``wait``: first collect garbage (a ``DistributedDataParallel`` wrapper held by a reference cycle
    would otherwise release its communication state after the group is gone) and meet the other
    ranks at a barrier, so that no rank closes its connections while another still uses them (with
    gloo, a rank's exit during a peer's last collective can abort the peer). Pass False after an
    error: the barrier would wait for ranks that are gone."""
    if dist.is_available() and dist.is_initialized():
        if wait:
            gc.collect()
            dist.barrier()
        dist.destroy_process_group()


def split_batch(batch_size: int, world_size: int) -> int:
    """Scans per rank of a total ``batch_size`` (``ValueError`` unless it divides evenly)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    if batch_size % world_size:
        raise ValueError(
            f"batch_size: the total batch of {batch_size} scans does not split evenly over {world_size} "
            f"processes; use a multiple of {world_size}"
        )
    return batch_size // world_size


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s random streams (point shuffle, torch RNG): ``seed`` on rank 0
    (so world size 1 is the single-process run), ``seed + rank * 2**32`` on the others."""
    if rank < 0:
        raise ValueError(f"rank: expected >= 0, got {rank}")
    return int(seed) + int(rank) * RANK_SEED_STRIDE


class DistributedEpochSampler(torch.utils.data.DistributedSampler):
    """:class:`~pcops.models.data.EpochSampler`'s order (a permutation of ``seed`` and the epoch,
    set with ``set_epoch``) cut to whole global batches of ``batch_size`` scans, rank ``r`` taking
    every ``world_size``-th scan from position ``r``: each rank's ``k``-th batch of
    ``batch_size / world_size`` scans is its part of the single process's ``k``-th batch. Yields
    ``(index, epoch)`` pairs as ``EpochSampler`` does."""

    def __init__(
        self,
        n: int,
        seed: int,
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        start_epoch: int = 0,
    ):
        split_batch(batch_size, world_size)
        super().__init__(range(n), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.n, self.batch_size, self.epoch = n, batch_size, start_epoch
        self.usable = (n // batch_size) * batch_size
        self.num_samples = self.usable // world_size
        self.total_size = self.usable

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self):
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)  # EpochSampler's
            order = torch.randperm(self.n, generator=gen)
        else:
            order = torch.arange(self.n)
        mine = order[: self.usable][self.rank :: self.num_replicas]
        return iter([(int(i), self.epoch) for i in mine])


def shard_batches(n: int, batch_size: int, rank: int, world_size: int) -> list[int]:
    """Indices of the ``n`` scans that rank ``rank`` handles: the batches ``k`` of the single-process
    order (``batch_size`` consecutive scans, the last one possibly short) with ``k % world_size ==
    rank``, in order. Batched with ``batch_size``, they give exactly the single process's batches."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank}")
    out: list[int] = []
    for k, start in enumerate(range(0, n, batch_size)):
        if k % world_size == rank:
            out.extend(range(start, min(start + batch_size, n)))
    return out


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # NamedTuple
        return type(obj)(*(_to(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def gather_ordered(items: list, device=None) -> list:
    """``items``: this rank's ``(global_index, value)`` pairs (values: tensors, NamedTuples, lists,
    dicts of them). Returns every rank's values in ``global_index`` order (``all_gather_object``;
    tensors travel on the CPU and come back on ``device`` if given). World size 1: no collective."""
    env = current()
    local = [(int(i), _to(v, "cpu")) for i, v in items]
    if env.enabled:
        parts: list = [None] * env.world_size
        dist.all_gather_object(parts, local)
        merged = [p for part in parts for p in part]
    else:
        merged = local
    merged.sort(key=lambda p: p[0])
    idx = [i for i, _ in merged]
    if len(set(idx)) != len(idx):
        raise ValueError("items: the same global index was given by more than one rank")
    return [v if device is None else _to(v, device) for _, v in merged]


def all_reduce_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean over the ranks of a tensor (a copy; the tensor itself on world size 1)."""
    env = current()
    if not env.enabled:
        return values
    out = values.detach().clone()
    dist.all_reduce(out)
    return out / env.world_size


def broadcast_object(obj, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself on world size 1)."""
    if not current().enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into every rank's ``module``."""
    if not current().enabled:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(t.data, src=src)


@torch.no_grad()
def average_batchnorm_stats(module: nn.Module) -> None:
    """Average every BatchNorm's running mean and variance over the ranks (after a precise-BN
    recalibration on each rank's own batches)."""
    env = current()
    if not env.enabled:
        return
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            for t in (m.running_mean, m.running_var):
                dist.all_reduce(t)
                t.div_(env.world_size)


class TrainForward(nn.Module):
    """The module that ``DistributedDataParallel`` wraps: ``forward`` is the model's
    :meth:`~pcops.models.pointpillars.PointPillars.forward_train` (its parameters are the model's)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, points: torch.Tensor, lengths: torch.Tensor | None = None):
        return self.model.forward_train(points, lengths)


def sync_group(bn: nn.Module):
    """The process group over which ``bn``'s batch statistics are synchronised, or None (not a
    ``SyncBatchNorm`` / :class:`CpuSyncBatchNorm`, not training, or no process group of several ranks)."""
    if not (isinstance(bn, (nn.SyncBatchNorm, CpuSyncBatchNorm)) and bn.training):
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = getattr(bn, "process_group", None) or dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        out = t.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None


def all_reduce_sum(t: torch.Tensor, group) -> torch.Tensor:
    """Sum over ``group`` with autograd: the backward all-reduces (sums) the gradient, since every
    rank's loss depends on every rank's contribution to the shared statistics (DDP then averages
    the parameter gradients over the ranks, as for the rest of the model)."""
    return _AllReduceSum.apply(t, group)


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """SyncBatchNorm for CPU runs under gloo, where torch's ``SyncBatchNorm`` raises (and DDP refuses
    it on CPU modules): the batch mean and then the biased variance are all-reduced (autograd-aware,
    so the backward sums every rank's gradient of the shared statistics), and the running statistics
    are updated as torch's BatchNorm does (unbiased variance over the global count). Outside
    training or a process group of several ranks it is a plain BatchNorm."""

    process_group = None

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"input: expected at least 2-D input (N, C, ...), got {input.dim()}-D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        group = sync_group(self)
        if group is None or not self.track_running_stats:
            return super().forward(input)
        self._check_input_dim(input)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        x = input.float()
        with torch.no_grad():
            count = torch.tensor(float(x.numel() // x.shape[1]))
            dist.all_reduce(count, group=group)
        mean = all_reduce_sum(x.sum(dims), group) / count
        var = all_reduce_sum(((x - mean.view(shape)) ** 2).sum(dims), group) / count
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            f = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
            self.running_mean.mul_(1 - f).add_(mean.detach(), alpha=f)
            self.running_var.mul_(1 - f).add_(var.detach() * count / max(float(count) - 1, 1.0), alpha=f)
        y = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(input.dtype)


def convert_sync_batchnorm(model: nn.Module, process_group=None, cpu: bool | None = None) -> nn.Module:
    """Every BatchNorm of ``model`` (in place) to torch's ``SyncBatchNorm`` through
    ``SyncBatchNorm.convert_sync_batchnorm`` (parameters and statistics shared), and on the CPU
    (``cpu``; default: where the model's parameters are) on to :class:`CpuSyncBatchNorm`,
    remembering each module's class for :func:`revert_sync_batchnorm`. Returns ``model``. Raises
    ``ValueError`` for a BatchNorm subclass that is not one of torch's (its forward would be lost)."""
    standard = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, CpuSyncBatchNorm)
    if cpu is None:
        cpu = all(p.device.type == "cpu" for p in model.parameters())
    classes = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            if type(m) not in standard:
                raise ValueError(f"model: {name} is a {type(m).__name__}, not a torch BatchNorm: cannot convert")
            classes[name] = getattr(m, "_pcops_bn_class", type(m))
    if "" in classes:
        raise ValueError("model: expected a module holding BatchNorm layers, got a BatchNorm itself")
    nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group)
    for name, m in model.named_modules():
        if name in classes:
            if cpu:
                m.__class__ = CpuSyncBatchNorm
            m._pcops_bn_class = classes[name]
    return model


def revert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Undo :func:`convert_sync_batchnorm` in place: each converted module back to its original
    BatchNorm class, sharing its parameters and running statistics. Returns ``model``."""
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            cls = getattr(child, "_pcops_bn_class", None)
            if cls is None or cls in (nn.SyncBatchNorm, CpuSyncBatchNorm):
                continue
            new = cls(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            if child.affine:
                new.weight, new.bias = child.weight, child.bias
            if child.track_running_stats:
                new.running_mean, new.running_var = child.running_mean, child.running_var
                new.num_batches_tracked = child.num_batches_tracked
            new.train(child.training)
            setattr(parent, child_name, new)
    return model

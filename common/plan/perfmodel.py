"""A performance model of one epoch in every mode, from a short profile (pure functions).

Per-sample costs measured on one host rank and one DPU rank (load + augment, forward + backward,
evaluation), the allreduce time per step, and the transfer time of one batch are enough to
predict the host's critical path per epoch:

    none    S * (B*(aug_h + train_h) + allreduce + opt)                    + val_h
            (with W processes building the batches beside training, `none_workers`, as the
            workers of a DataLoader do: S * max(B*train_h + allreduce + opt, B*aug_h/W))
    da      S * max(B*(train_h + fin_h) + allreduce + opt, F*(B*aug_d + transfer))   + val_h
            (with --da-host-share s, --dpu-workers K, --da-host-workers H: the DPU term is
            (1-s)*F*(B*aug_d/K + transfer), the host finishes (1-s)*B*fin_h, and its own share s*B*aug_h/H
            runs beside training in its H worker processes, or adds to the host's step when it builds
            in process, H = 0)
    mv      max(S * (B*(aug_h + train_h) + allreduce + opt) + (1-f)*val_h,  f*val_d)
    hybrid  da's training term, mv's validation term
    naive   S' * (max(B*(aug_h + train_h), b*(aug_d + train_d)) + allreduce_all + opt) + val_h

Under the uint8 wire (`common.data.wire`) da's aug_d is the DPU's integer part of the transform
(`dpu_send_aug`), transfer the uint8 batch's, and fin_h the host's float steps (ToTensor, Normalize)
per received sample; on the float wire fin_h = 0 and aug_d is the whole transform (naive's always).

with S = steps per epoch (ceil(n / (H*B)); S' for the proportional naive split), F = host ranks
fed per augmentation rank, val_h = n_val/H * eval_h, val_d = n_val/M_mv * eval_d, f the DPU share of
validation (as `--mv-dpu-fraction auto` picks it) and b the naive DPU batch (as
`--dpu-batch-size auto` picks it). In steady state the DPU work of da overlaps host steps (the
circular buffers decouple them) and mv's validation of epoch i overlaps epoch i+1, hence the max.

In da's and hybrid's host term train_h is the host's forward/backward timed while the DPU ranks
build batches beside it (`host_beside` x train_h): where the DPU ranks share the host's machine (the
emulated node) their work may slow it; none and mv train beside DPU ranks that wait or validate part
of the epoch, and use the step timed while they wait.

**GPU host ranks** (`gpu_step` > 0): the host's training step is no longer CPU work. CUDA launches
are asynchronous, so the host process's CPU time per step (`host_cpu`: receiving a batch and copying
it into pinned memory, plus anything it builds itself) runs beside the GPU's step (`gpu_step`:
forward, backward and optimizer, timed with a synchronize), and the batch's copy to the GPU (`h2d`)
runs on a side stream beside both (`common.train.device.Staging`). So in every formula above the
host's compute term B*train_h + opt becomes

    max(gpu_step, h2d, host_cpu + in-process building) + allreduce

`none` builds in process (the built-in trainer: + B*aug_h), or, as the peer a GPU user runs
(`DataLoader(num_workers=W)`), in W workers: max(gpu_step, h2d, host_cpu, B*aug_h/W) + allreduce;
`da` with an in-process host share adds s*B*aug_h to host_cpu. `naive` (CPU replicas) is not
predicted from a GPU profile. All GPU fields 0: the CPU formulas, unchanged. The same functions
choose `--mode auto` and project to larger clusters (`dpurun project`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Collection, Mapping, Optional

from dpuoffload.common.modes import CONCRETE, Mode
from dpuoffload.common.plan.naive import balanced_dpu_batch, naive_steps
from dpuoffload.common.plan.validation_split import auto_share

MODES = CONCRETE


@dataclass(frozen=True, kw_only=True)
class Profile:
    """What one epoch costs, per part. Seconds per sample unless named per step / per batch."""

    n_train: int
    n_val: int
    host_ranks: int
    dpu_ranks: int
    batch: int
    host_aug: float
    host_train: float
    host_eval: float
    dpu_aug: float
    dpu_train: float
    dpu_eval: float
    allreduce: float            # per step, among host ranks
    allreduce_all: float = -1   # per step, among host and DPU ranks (naive); -1: same as allreduce
    optimizer: float = 0.0      # per step
    transfer: float = 0.0       # per batch, DPU -> host (da)
    grad_bytes: int = 0         # gradient size (for projecting the allreduce to other scales)
    dpu_batch: Optional[int] = None
    mv_fraction: Optional[float] = None
    da_ranks: Optional[int] = None  # hybrid split; default: half the DPU ranks (at least 1)
    host_share: Optional[float] = 0.0  # --da-host-share: the steps the host ranks build; None: auto (balanced)
    host_workers: int = 1       # --da-host-workers (0: the host builds its share in the training process)
    dpu_workers: int = 0        # --dpu-workers per stream (0: in the DPU rank's process, like 1)
    none_workers: int = 0       # processes building none's batches beside training (0: in the training
                                # process, as the built-in trainer; W: the DataLoader(num_workers=W) peer)
    gpu_step: float = 0.0       # per step: the GPU's forward + backward + optimizer (0: the host trains on CPUs)
    h2d: float = 0.0            # per batch: its copy to the GPU (from pinned memory, on a side stream)
    host_cpu: float = 0.0       # per step on a GPU host: the host process's own CPU work (receive, pinned copy)
    host_finish: float = 0.0    # per sample received from a DPU rank: the host's float steps (uint8 wire; 0: float)
    dpu_send_aug: Optional[float] = None  # per sample a DPU rank builds to send: its part of the transform
                                          # (uint8 wire); None: dpu_aug, the whole (float wire; naive's own)
    host_beside: float = 1.0    # host_train beside DPU ranks building batches, over host_train (measured:
                                # `common.train.interference`; 1.0 where they do not share the host's machine)
    host_step_spread: float = 1.0  # the profile's host steps, upper over lower quartile: how far their time moved
                                   # while measured (not a cost: the predictions' uncertainty; 1.0 unmeasured)

    def __post_init__(self) -> None:
        for name in ("n_train", "host_ranks", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"profile: {name} must be >= 1")
        for name in ("none_workers", "gpu_step", "h2d", "host_cpu", "host_finish"):
            if getattr(self, name) < 0:
                raise ValueError(f"profile: {name} must be >= 0")
        if self.host_beside < 1:
            raise ValueError("profile: host_beside must be >= 1 (work elsewhere does not speed the host)")
        if self.host_step_spread < 1:
            raise ValueError("profile: host_step_spread must be >= 1 (an upper quartile over a lower one)")

    @property
    def on_gpu(self) -> bool:
        """The host ranks train on GPUs (a measured GPU step)."""
        return self.gpu_step > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    mode: str
    epoch_s: float
    train_s: float                 # the training part of the host's epoch
    validation_s: float            # validation on the host's critical path
    bottleneck: str                # what bounds the epoch
    detail: dict[str, float] = field(default_factory=dict)


def _steps(p: Profile) -> int:
    return math.ceil(p.n_train / (p.host_ranks * p.batch))


def _host_step(p: Profile, with_aug: bool, in_process: float = 0.0, beside_dpu: bool = False) -> float:
    """The host's step: training, plus building its batch when `with_aug` (in the training process,
    or in `none_workers` processes beside it), plus `in_process` seconds of other building; its
    forward/backward as slowed by DPU ranks building batches beside it when `beside_dpu` (da)."""
    if with_aug and p.none_workers > 0:  # the peer's workers build beside the training
        return max(_host_step(p, False, in_process), p.batch * p.host_aug / p.none_workers)
    if p.on_gpu:  # asynchronous launches: the GPU step, the host's CPU and the side-stream copy overlap
        build = p.batch * p.host_aug if with_aug else 0.0
        return max(p.gpu_step, p.h2d, p.host_cpu + build + in_process) + p.allreduce
    train = p.host_train * (p.host_beside if beside_dpu else 1.0)
    return p.batch * (train + (p.host_aug if with_aug else 0.0)) + p.allreduce + p.optimizer + in_process


def _host_serial(p: Profile) -> float:
    """What the host's in-process building adds to: on CPUs its whole step, on a GPU host only its
    own CPU work (the GPU's step runs beside it)."""
    return p.host_cpu + p.allreduce if p.on_gpu else _host_step(p, with_aug=False, beside_dpu=True)


def _val_host(p: Profile, share: float = 0.0) -> float:
    return (1.0 - share) * p.n_val / p.host_ranks * p.host_eval


def split(p: Profile, mode: Mode) -> tuple[int, int]:
    """(augmentation ranks, validation ranks) among the DPU ranks for `mode`."""
    if mode is Mode.DA:
        return p.dpu_ranks, 0
    if mode is Mode.MV:
        return 0, p.dpu_ranks
    if mode is Mode.HYBRID:
        da = p.da_ranks or max(1, p.dpu_ranks // 2)
        return da, max(p.dpu_ranks - da, 0)
    return 0, 0


def predict(mode: Mode | str, p: Profile) -> Prediction:
    """The predicted epoch of `mode` (raises ValueError for a mode the rank counts cannot run)."""
    mode = Mode(mode)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    if mode.offloads and p.dpu_ranks < 1:
        raise ValueError(f"--mode {mode} needs DPU ranks")
    if mode is Mode.NONE:
        train = _steps(p) * _host_step(p, with_aug=True)
        return Prediction(mode, train + _val_host(p), train, _val_host(p), "host compute")
    if mode is Mode.NAIVE:
        if p.on_gpu:
            raise ValueError("--mode naive trains every replica on CPUs, and this profile measured GPU host ranks")
        return _predict_naive(p)
    n_da, n_mv = split(p, mode)
    if mode is Mode.HYBRID and (n_da < 1 or n_mv < 1):
        raise ValueError("--mode hybrid needs at least 2 DPU ranks")
    share = host_share(p, n_da)
    train, train_bound = _train_term(p, n_da, share)
    feeding = {"host_share": share} if n_da else {}
    if n_mv == 0:
        return Prediction(mode, train + _val_host(p), train, _val_host(p), train_bound, feeding)
    pred = _with_offloaded_validation(mode, p, train, train_bound, n_mv)
    return replace(pred, detail={**pred.detail, **feeding})


def host_share(p: Profile, n_da: int) -> float:
    """The share of steps the host ranks build with `n_da` augmentation ranks: as given, or balanced (auto)."""
    if n_da == 0:
        return 0.0
    return p.host_share if p.host_share is not None else balanced_host_share(p, n_da)


def _train_term(p: Profile, n_da: int, share: float) -> tuple[float, str]:
    if n_da == 0:
        return _steps(p) * _host_step(p, with_aug=True), "host compute"
    terms = feeding_terms(p, n_da, share)
    bound = max(terms, key=terms.__getitem__)
    return _steps(p) * terms[bound], bound


def feeding_terms(p: Profile, n_da: int, share: float) -> dict[str, float]:
    """Seconds per step of each side of `da` when the host ranks build `share` of the steps: the
    host's step (with its own building when in process), the host's worker processes, the DPU rank."""
    fan_out = math.ceil(p.host_ranks / n_da)
    host_build = p.batch * p.host_aug
    finish = (1 - share) * p.batch * p.host_finish  # (the float steps of the batches the DPU sent)
    host = _host_step(p, with_aug=False, in_process=finish + (share * host_build if p.host_workers == 0 else 0.0),
                      beside_dpu=True)
    dpu = p.batch * _dpu_send_aug(p) / max(p.dpu_workers, 1) + p.transfer
    terms = {"host compute": host, "DPU augmentation": (1 - share) * fan_out * dpu}
    if p.host_workers > 0 and share > 0:
        terms["host augmentation"] = share * host_build / p.host_workers
    return terms


def _dpu_send_aug(p: Profile) -> float:
    return p.dpu_aug if p.dpu_send_aug is None else p.dpu_send_aug


def balanced_host_share(p: Profile, n_da: Optional[int] = None) -> float:
    """`--da-host-share auto`: the share of the steps the host ranks build so that host and DPU
    producers take equally long per step (neither waits for the other), to 0.001.

    With worker processes the host's share s costs s*h beside training and the DPU's (1-s)*d, so
    s = d/(h+d); built in the training process (H = 0) the host's step grows by s*h and sheds the
    float steps s*f of the batches it no longer receives, so s = (d - step - f)/(h + d - f), where on
    a GPU host `step` is the host's own CPU work per step (the GPU's step runs beside it). h: seconds
    for the host's workers to build one batch; d: for the DPU rank to build and send one (its K
    workers, shared by the F host ranks it feeds); f: the host's float steps on one received batch."""
    n_da = n_da if n_da is not None else split(p, Mode.DA)[0]
    d = feeding_terms(p, n_da, 0.0)["DPU augmentation"]
    h = p.batch * p.host_aug / max(p.host_workers, 1)
    f = p.batch * p.host_finish
    if d <= 0:
        return 0.0
    share = (d - _host_serial(p) - f) / max(h + d - f, 1e-12) if p.host_workers == 0 else d / (h + d)
    return round(min(max(share, 0.0), 1.0), 3)


def _with_offloaded_validation(mode: Mode, p: Profile, train: float, bound: str, n_mv: int) -> Prediction:
    a = p.n_val * p.dpu_eval / n_mv
    share = p.mv_fraction if p.mv_fraction is not None else auto_share(
        train, p.n_val, p.dpu_eval, n_mv, p.host_eval, p.host_ranks)
    host = train + _val_host(p, share)
    dpu = share * a
    epoch = max(host, dpu)
    return Prediction(mode, epoch, train, _val_host(p, share), "DPU validation" if dpu > host else bound,
                      {"mv_fraction": share, "dpu_validation_s": dpu})


def _predict_naive(p: Profile) -> Prediction:
    b = p.dpu_batch or balanced_dpu_batch(p.batch, p.host_aug + p.host_train, p.dpu_aug + p.dpu_train)
    sizes = [p.batch] * p.host_ranks + [b] * p.dpu_ranks
    steps = naive_steps(p.n_train, sizes, drop_last=False)
    host, dpu = p.batch * (p.host_aug + p.host_train), b * (p.dpu_aug + p.dpu_train)
    allreduce = p.allreduce_all if p.allreduce_all >= 0 else p.allreduce
    train = steps * (max(host, dpu) + allreduce + p.optimizer)
    return Prediction(Mode.NAIVE, train + _val_host(p), train, _val_host(p),
                      "DPU replica" if dpu > host else "host compute", {"dpu_batch": b})


def predict_all(p: Profile) -> dict[Mode, Prediction]:
    """Every mode the rank counts can run."""
    out = {}
    for mode in MODES:
        try:
            out[mode] = predict(mode, p)
        except ValueError:
            continue
    return out


def candidates(preds: Mapping[Mode, Prediction], allow: Collection[Mode] = ()) -> list[Mode]:
    """The predicted modes `--mode auto` may pick: those that keep the math of `none`, plus `allow`.

    A mode that changes the training (naive: other batch sizes and step counts, so other weights)
    is never picked silently: the user must name it in `allow` (`--auto-allow naive`).
    """
    return [m for m in preds if m.keeps_math or m in allow]


# Predictions this close are a tie: the profile of a few steps moves more than this between two runs
# (shufflenet_v2's da and mv were 0.2 % apart and the choice flipped between runs), so picking the
# faster of two tied modes picks by noise. A tie costs at most this share of an epoch if the model is
# right; it is the target `--mode auto` is held to against the best mode run by hand
# (benchmarks/workloads.py, auto_vs_best <= 1.03).
TIE_MARGIN = 0.03
# Who wins a tie: the mode that changes least of the training's own path. `none`; then `mv` (the
# training batches stay the host's own, only validation moves, and an Arm DPU's float rounding can
# touch only the validation sums); then `da` (the batches are built elsewhere); `hybrid` (both).
# In both workload runs of 2026-11-25/26, mv was the fastest mode measured wherever it tied with da; in
# 2026-11-28's first, da was, on shufflenet_v2, by 3 %, and in the three after it mv again: a tie either way,
# which this order keeps deterministic.
TIE_ORDER = (Mode.NONE, Mode.MV, Mode.DA, Mode.HYBRID, Mode.NAIVE)


def tied_modes(preds: Mapping[Mode, Prediction], allow: Collection[Mode] = ()) -> list[Mode]:
    """The allowed modes predicted within `TIE_MARGIN` of the shortest epoch, in `TIE_ORDER`."""
    allowed = candidates(preds, allow)
    best = min(preds[m].epoch_s for m in allowed)
    return sorted((m for m in allowed if preds[m].epoch_s <= best * (1 + TIE_MARGIN)), key=TIE_ORDER.index)


def choose(p: Profile, allow: Collection[Mode] = ()) -> Mode:
    """The allowed mode with the shortest predicted epoch; modes within `TIE_MARGIN` of it are a tie,
    which goes by `TIE_ORDER`, so the same workload gets the same mode every run."""
    return tied_modes(predict_all(p), allow)[0]


def explain_choice(preds: Mapping[Mode, Prediction], chosen: Mode, allow: Collection[Mode] = ()) -> str:
    """One line: what `--mode auto` chose, each candidate's predicted epoch, and what was left out."""
    allowed = candidates(preds, allow)
    times = ", ".join(f"{m} {preds[m].epoch_s:.2f} s" for m in sorted(allowed, key=lambda m: preds[m].epoch_s))
    tied = tied_modes(preds, allow)
    if len(tied) > 1 and chosen in tied:
        line = (f"--mode auto chose {chosen}: {' and '.join(str(m) for m in tied)} are predicted within "
                f"{TIE_MARGIN:.0%} of each other, a tie at the model's resolution, which goes to the mode that "
                f"changes least of the training's own path ({times})")
    else:
        line = f"--mode auto chose {chosen}: the shortest predicted epoch ({times})"
    excluded = [m for m in preds if m not in allowed]
    if excluded:
        names = ", ".join(f"{m} ({preds[m].epoch_s:.2f} s)" for m in excluded)
        flags = " ".join(f"--auto-allow {m}" for m in excluded)
        line += f"; excluded {names}: it changes the training (batch sizes, steps), allow it with {flags}"
    return line


def ring_allreduce_s(nbytes: int, ranks: int, bandwidth_Bps: float, latency_s: float) -> float:
    """Ring allreduce time: 2(N-1) steps of nbytes/N each (the bandwidth-optimal algorithm)."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * (latency_s + nbytes / ranks / bandwidth_Bps)


def project(p: Profile, nodes: int, host_per_node: int, dpu_per_node: int, grad_bytes: int,
            bandwidth_Bps: float, latency_s: float) -> Profile:
    """The same workload on `nodes` nodes: per-sample costs as measured, allreduce times from the
    ring model over the stated network (labelled a projection wherever it is shown)."""
    hosts, dpus = nodes * host_per_node, nodes * dpu_per_node
    return replace(p, host_ranks=hosts, dpu_ranks=dpus,
                   allreduce=ring_allreduce_s(grad_bytes, hosts, bandwidth_Bps, latency_s),
                   allreduce_all=ring_allreduce_s(grad_bytes, hosts + dpus, bandwidth_Bps, latency_s),
                   da_ranks=(p.da_ranks or max(1, p.dpu_ranks // 2)) * nodes if p.da_ranks else None)


def format_table(preds: Mapping[Mode, Prediction], chosen: Optional[str] = None) -> str:
    base = preds.get(Mode.NONE)
    lines = ["mode     predicted epoch s   vs none   bound"]
    for mode, pr in preds.items():
        ratio = f"{pr.epoch_s / base.epoch_s:7.3f}" if base else "      -"
        mark = "  <- chosen" if mode == chosen else ""
        lines.append(f"{mode:8s} {pr.epoch_s:17.3f}   {ratio}   {pr.bottleneck}{mark}")
    return "\n".join(lines)

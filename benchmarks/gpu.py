"""GPU host ranks fed by DPU cores and host cores (issue 12): the issue's table, side by side, one run.

    python benchmarks/gpu.py [--device auto|cpu|cuda] [--workloads resnet50 shufflenet_v2]
                             [--host-cores 8] [--dpu-cores 8] [--dpu-speed 0.5] [--reps 1] [--quick]

One host rank trains on the GPU; it and its data workers run on the first `--host-cores` h cores,
and the emulated DPU's d = `--dpu-cores` cores are the next ones, throttled to `--dpu-speed` s of a
core each (a CPU cgroup, as `dpurun --dpu-speed`). Per workload (resnet50 on 224 px crops of
500x375 JPEGs, shufflenet_v2 on 64x64 JPEGs: real photographs with a digit drawn on them, written
once as an ImageFolder under .cache/data/ by `write_jpegs`), side by side:

1. **GPU-bound**: synthetic batches already on the GPU, bf16 autocast, channels_last, timed in this
   process (`autoselect.train_step_seconds`: the trainer's step, synchronized) under the ranks'
   deterministic setting; on CUDA also with cuDNN autotuned and determinism off, for what that costs;
2. **peer**: the project's host program fed by `DataLoader(num_workers=h, pin_memory=True,
   prefetch_factor=4)` over the torchvision ImageFolder, workers on the h host cores
   (`benchmarks/peer_host.py`, `--mode none`);
3. **da, d DPU cores**: the real dpurun MPMD job, one DPU rank building with `--dpu-workers d`; and
   the same on the uint8 wire (`--wire uint8`: a quarter of the bytes, the float steps run on the
   GPU after the copy; full runs only);
4. **host + DPU**: `--da-host-workers h` + `--dpu-workers d`, with `--da-host-share auto` and with
   the share fixed by counting cores, h / (h + s*d); and share 1.0 (the host's h workers alone, the
   no-regression check against the peer);
5. **short epochs** (a few batches each, several epochs) for the peer and for ours (share auto);
6. `--mode auto` on the same cores: what its profile measured, the mode and share it chose.

Definitions. Long-epoch img/s: one epoch of `--long-steps` batches, the steady state of its second
half (batch x steps / their seconds; start-up, cuDNN warm-up and the pipelines filling are left
out). Short-epoch img/s: epochs 2.. of `--short-steps` batches each, samples over training seconds,
epoch edges included. **GPU busy** = img/s / the GPU-bound img/s under the trainer's settings: the
share of the ceiling reached, not a utilization counter. Every run logs its per-epoch sha256 of the
batches in `--quick` (in a full run, two extra untimed runs do, since hashing a 154 MB batch costs more
than the GPU's step): ours and the peer must train on the same batches (on a CPU, also the same
losses), else the benchmark fails. The model's predictions use this process's measurements (GPU
step, the copy to the GPU, a pinned memcpy per batch, one core's augmentation rate; DPU cores at s
times it) and `perfmodel.predict`.

`--quick` (the test suite, on a CPU): resnet50 on 32 px crops of 100x75 JPEGs, batch 8, 1 host and
1 DPU core, DPU unthrottled, without the fixed share and `--mode auto` (a minute; nothing it measures
says anything about a GPU).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import (  # noqa: E402
    DATA,
    QUICK_DPU_SPEED,
    RunLog,
    Section,
    bench_parser,
    dpurun_cmd,
    machine,
    run_logged,
    settings,
    spread,
    table,
    write_json,
)

JPEG_VERSION = 1
PREFETCH = 4              # the peer's prefetch_factor and our --da-buffers
AMP = "bf16"
TARGETS = {"share_vs_bound": 0.90, "share1_vs_peer": 0.97, "short_vs_long": 0.95, "prediction_error": 0.10,
           "busy": 0.90}


@dataclass(frozen=True)
class Workload:
    """A model on JPEGs of `size` (width, height) augmented to `crop` px, batch `batch`."""

    model: str
    size: tuple[int, int]
    crop: int
    batch: int

    @property
    def dataset(self) -> str:
        return f"benchmarks.gpufactories:crop{self.crop}"


WORKLOADS = {"resnet50": Workload("resnet50", (500, 375), 224, 256),
             "shufflenet_v2": Workload("shufflenet_v2", (64, 64), 64, 256)}
QUICK_WORKLOADS = {"resnet50": Workload("resnet50", (100, 75), 32, 8),
                   "shufflenet_v2": Workload("shufflenet_v2", (64, 64), 32, 8)}


# ------------------------------------------------------------------------------------------ data
def write_jpegs(size: tuple[int, int], n_train: int, n_val: int, seed: int = 0) -> Path:
    """An ImageFolder of `n_train` + `n_val` JPEGs of `size` (10 classes), cached under DATA.

    Made like `dpurun make-data`'s tinyimagenet, at any size and count: a random crop of one of
    scikit-learn's two bundled photographs (427x640) resized to `size` and dimmed, with a digit of
    its `load_digits` drawn over it in a random colour (the digit is the label). Deterministic
    from the seed; a folder already holding at least as many images is reused; written into a
    temporary directory and renamed into place, so it is complete or absent.
    """
    root = DATA / f"jpeg{size[0]}x{size[1]}"
    marker = root / "gpu-benchmark.json"
    want = {"version": JPEG_VERSION, "size": list(size), "seed": seed}
    if marker.exists():
        import json

        have = json.loads(marker.read_text())
        if {k: have.get(k) for k in want} == want and have["n_train"] >= n_train and have["n_val"] >= n_val:
            return root
    _render_folder(root, size, n_train, n_val, seed)
    return root


def _render_folder(root: Path, size: tuple[int, int], n_train: int, n_val: int, seed: int) -> None:
    import json
    from multiprocessing import get_context

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    jobs = [(tmp, split, i, size, seed) for split, n in (("train", n_train), ("val", n_val)) for i in range(n)]
    t0 = time.perf_counter()
    with get_context("fork").Pool(max(1, len(os.sched_getaffinity(0)))) as pool:
        for _ in pool.imap_unordered(_write_one, jobs, chunksize=64):
            pass
    (tmp / "gpu-benchmark.json").write_text(json.dumps(
        {"version": JPEG_VERSION, "size": list(size), "seed": seed, "n_train": n_train, "n_val": n_val,
         "source": "scikit-learn load_digits over crops of load_sample_images (benchmarks/gpu.py)"}))
    if root.exists():
        shutil.rmtree(root)
    os.rename(tmp, root)
    print(f"wrote {root}: {n_train} + {n_val} JPEGs of {size[0]}x{size[1]} in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr, flush=True)


_SOURCES: list[Any] = []


def _write_one(job: tuple[Path, str, int, tuple[int, int], int]) -> None:
    import io

    import numpy as np
    from PIL import Image

    from dpuoffload.launch.make_data import load_sources

    tmp, split, i, (w, h), seed = job
    if not _SOURCES:  # once per pool process
        _SOURCES.append(load_sources())
    src = _SOURCES[0]
    rng = np.random.default_rng([seed, 0 if split == "train" else 1, i])
    k = int(rng.choice(np.flatnonzero(src.labels == i % 10)))  # classes in turn: every class in every split
    photo = src.photos[int(rng.integers(len(src.photos)))]
    ph, pw = photo.shape[:2]
    cw = int(rng.integers(min(pw, ph * w // h) // 2, min(pw, ph * w // h) + 1))  # the crop keeps w:h
    ch = max(1, cw * h // w)
    y0, x0 = int(rng.integers(ph - ch + 1)), int(rng.integers(pw - cw + 1))
    background = np.asarray(Image.fromarray(photo[y0:y0 + ch, x0:x0 + cw]).resize((w, h), Image.BILINEAR),
                            dtype=np.float64) * 0.5
    side = int(rng.integers(min(w, h) // 3, min(w, h) * 2 // 3 + 1))
    digit = Image.fromarray(np.round(src.digits[k] * 255).astype(np.uint8)).resize((side, side), Image.BICUBIC)
    alpha = np.zeros((h, w, 1))
    dy, dx = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
    alpha[dy:dy + side, dx:dx + side, 0] = np.asarray(digit, dtype=np.float64) / 255.0
    image = np.round(alpha * rng.uniform(160, 255, size=3) + (1 - alpha) * background).clip(0, 255)
    buf = io.BytesIO()
    Image.fromarray(image.astype(np.uint8)).save(buf, format="JPEG", quality=90)
    path = tmp / split / f"{int(src.labels[k])}" / f"{i:06d}.JPEG"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


# ------------------------------------------------------------------------------ in-process probes
def probe(w: Workload, root: Path, device: str, steps: int, core: int) -> dict[str, float]:
    """What this process measures (pinned to one host core, one torch thread): the GPU-bound step
    under the trainer's settings (and autotuned on CUDA), the copy of a batch to the GPU, a pinned
    memcpy of one, and one core's seconds to load and augment a sample."""
    import torch

    from benchmarks.gpufactories import build
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.data.sampling import PerSampleSeeded
    from dpuoffload.common.models.zoo import build_model
    from dpuoffload.common.runtime.torchsetup import use_deterministic_algorithms
    from dpuoffload.common.train.autoselect import (
        aug_seconds_per_sample,
        h2d_seconds,
        pinned_copy_seconds,
        train_step_seconds,
    )
    from dpuoffload.common.train.device import Compute

    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train = PerSampleSeeded(build(str(root), True, w.crop), 0)
        aug, sample = aug_seconds_per_sample(train, min(2 * w.batch, len(train)))
        cfg = RunConfig(model=w.model, batch_size=w.batch, amp=AMP, channels_last=True)
        compute = Compute.of(torch.device(device), AMP, True)
        x = torch.randn(w.batch, *sample.shape)
        y = torch.randint(0, 10, (w.batch,))
        use_deterministic_algorithms()
        out = {"aug_s": aug, "step_s": train_step_seconds(cfg, compute.place(build_model(cfg, 10)), compute, x, y,
                                                          steps)}
        if device == "cuda":
            out.update(h2d_s=h2d_seconds(compute, x, y), memcpy_s=pinned_copy_seconds(x, y))
            out["step_autotuned_s"] = _autotuned_step(cfg, compute, x, y, steps)
            out["step_no_read_s"] = train_step_seconds(cfg, compute.place(build_model(cfg, 10)), compute, x, y,
                                                       steps, read_loss=False)  # what the trainer's loss read costs
        else:
            t0 = time.perf_counter()
            x.clone()
            out.update(h2d_s=0.0, memcpy_s=time.perf_counter() - t0)
        return out
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, mask)


def _autotuned_step(cfg: Any, compute: Any, x: Any, y: Any, steps: int) -> float:
    import torch

    from dpuoffload.common.models.zoo import build_model
    from dpuoffload.common.runtime.torchsetup import use_deterministic_algorithms
    from dpuoffload.common.train.autoselect import train_step_seconds

    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    try:
        return train_step_seconds(cfg, compute.place(build_model(cfg, 10)), compute, x, y, steps)
    finally:
        torch.backends.cudnn.benchmark = False
        use_deterministic_algorithms()


# ------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Layout:
    """The cores and lengths of one benchmark run."""

    host: tuple[int, ...]
    dpu: tuple[int, ...]
    speed: float
    device: str
    long_steps: int
    short_steps: int
    short_epochs: int
    digests: bool                # --digest-batches on the timed runs (--quick)

    @property
    def fixed_share(self) -> float:
        """The share a user counting cores would set: h host cores against d cores at speed s."""
        return round(len(self.host) / (len(self.host) + self.speed * len(self.dpu)), 3)


def cores_of(args: argparse.Namespace) -> tuple[tuple[int, ...], tuple[int, ...]]:
    available = sorted(os.sched_getaffinity(0))
    if args.host_cores < 1 or args.dpu_cores < 1 or args.host_cores + args.dpu_cores > len(available):
        sys.exit(f"gpu.py: --host-cores {args.host_cores} + --dpu-cores {args.dpu_cores} need that many of this "
                 f"process's {len(available)} cores (each at least 1); lower them")
    return tuple(available[:args.host_cores]), tuple(available[args.host_cores:args.host_cores + args.dpu_cores])


def _list(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)


def training(w: Workload, root: Path, lay: Layout, steps: int, epochs: int, digests: bool) -> list[str]:
    flags = ["--model", w.model, "--dataset", w.dataset, "--data", str(root), "--batch-size", str(w.batch),
             "--train-subset", str(steps * w.batch), "--val-subset", "1", "--epochs", str(epochs),
             "--device", lay.device, "--amp", AMP, "--channels-last", "--da-buffers", str(PREFETCH)]
    return flags + (["--digest-batches"] if digests else [])


def run_ours(w: Workload, root: Path, lay: Layout, what: str, feeding: list[str], steps: int, epochs: int,
             digests: bool) -> RunLog:
    """A dpurun job: the host rank on the host cores, one DPU rank on the DPU cores at `lay.speed`.
    `--skip-checks`: the data set is this benchmark's factory, so dpurun would dry-import it before
    every job (a child process importing torch, building resnet50, the data set and a batch: 4 of the
    13 s of a `--quick` job here), a cost outside the measured epochs that a short GPU lease pays
    per job."""
    launcher = ["--host-ranks", "1", "--dpu-ranks", "1", "--dpu-cores", _list(lay.dpu), "--host-threads", "1",
                "--dpu-threads", "1", "--skip-checks", *(["--dpu-speed", str(lay.speed)] if lay.speed < 1 else [])]
    cmd = ["taskset", "-c", _list(lay.host + lay.dpu), *dpurun_cmd(launcher, [
        *training(w, root, lay, steps, epochs, digests), *feeding])]
    return run_logged(cmd, what)


def run_peer(w: Workload, root: Path, lay: Layout, what: str, steps: int, epochs: int, digests: bool) -> RunLog:
    """The host program on the host cores, fed by a DataLoader whose h workers share those cores."""
    from benchmarks.workloads import peer_cmd

    cmd = peer_cmd([*training(w, root, lay, steps, epochs, digests), "--mode", "none"], len(lay.host),
                   _list(lay.host), None, host_cores=lay.host, prefetch=PREFETCH, pin_memory=lay.device == "cuda")
    return run_logged(cmd, what)


def feeding(lay: Layout) -> dict[str, list[str]]:
    """Our feeding flags, one definition for the timed and the identity runs: the DPU alone, the
    same on the uint8 wire, and host + DPU (a share to add)."""
    h, d = len(lay.host), len(lay.dpu)
    da = ["--mode", "da", "--dpu-workers", str(d)]
    return {"da": da, "da uint8": [*da, "--wire", "uint8"], "share": [*da, "--da-host-workers", str(h)]}


def variants(w: Workload, root: Path, lay: Layout, quick: bool) -> dict[str, Any]:
    """Each timed variant: name -> a function running it once."""
    h, d, L, S, E = len(lay.host), len(lay.dpu), lay.long_steps, lay.short_steps, lay.short_epochs
    flags = feeding(lay)
    share = flags["share"]
    out = {
        "peer": lambda: run_peer(w, root, lay, "peer", L, 1, lay.digests),
        "da": lambda: run_ours(w, root, lay, "da", flags["da"], L, 1, lay.digests),
        "share auto": lambda: run_ours(w, root, lay, "share auto", [*share, "--da-host-share", "auto"], L, 1,
                                       lay.digests),
        "share 1.0": lambda: run_ours(w, root, lay, "share 1.0", ["--mode", "da", "--da-host-workers", str(h),
                                                                  "--da-host-share", "1.0"], L, 1, lay.digests),
        "peer short": lambda: run_peer(w, root, lay, "peer short", S, E, lay.digests),
        "ours short": lambda: run_ours(w, root, lay, "ours short", [*share, "--da-host-share", "auto"], S, E,
                                       lay.digests),
    }
    if quick:  # (a minute on 2 cores: the fixed share and --mode auto are two jobs more)
        return out
    # the uint8 wire: a quarter of the bytes to copy, the float steps on the GPU after the copy
    out["da uint8"] = lambda: run_ours(w, root, lay, "da uint8", flags["da uint8"], L, 1, lay.digests)
    # a share set by counting cores, against the measured one
    out["share fixed"] = lambda: run_ours(w, root, lay, "share fixed", [
        *share, "--da-host-share", str(lay.fixed_share)], L, 1, lay.digests)
    # --mode auto on the same cores: its GPU profile, its choice and its share (--device auto: the
    # config refuses --device cuda with --mode auto, which may pick CPU replicas)
    auto = replace(lay, device="auto" if lay.device == "cuda" else lay.device)
    out["auto"] = lambda: run_ours(w, root, auto, "auto", [  # 2 epochs: the second is the measured one
        "--mode", "auto", "--da-host-workers", str(h), "--dpu-workers", str(d), "--da-host-share", "auto"],
        max(L // 2, 2), 2, False)
    return out


def identity_runs(w: Workload, root: Path, lay: Layout) -> dict[str, RunLog]:
    """Untimed, with --digest-batches (full runs): the peer and ours (fixed share, both sides
    feeding), 2 epochs of 2 batches each."""
    flags = feeding(lay)
    return {"peer": run_peer(w, root, lay, "identity peer", 2, 2, True),
            "ours": run_ours(w, root, lay, "identity ours", [*flags["share"], "--da-host-share", str(lay.fixed_share)],
                             2, 2, True),
            "uint8": run_ours(w, root, lay, "identity uint8", flags["da uint8"], 2, 2, True)}


# -------------------------------------------------------------------------------------- analysis
SHORT = ("peer short", "ours short", "auto")  # rated over whole epochs (edges included), not a steady state


def steady_rate(log: RunLog, batch: int) -> float:
    """img/s over the second half of the last epoch's steps (one host rank, whole batches)."""
    times = log.host[-1]["step_times"]
    half = times[len(times) // 2:]
    return batch * len(half) / sum(half)


def short_rate(log: RunLog) -> float:
    """img/s over epochs 2.. (the first pays start-up), edges included: samples / training seconds."""
    epochs = log.epochs[1:] or log.epochs
    return sum(e["samples_per_s"] * e["train_time"] for e in epochs) / sum(e["train_time"] for e in epochs)


def same_training(a: RunLog, b: RunLog, losses: bool) -> bool:
    """The same batches every epoch (sha256 of each epoch's batches), and with `losses` the same step losses."""
    digests = [h.get("batch_digest") for h in a.host], [h.get("batch_digest") for h in b.host]
    same = digests[0] == digests[1] and all(digests[0])
    return same and (not losses or [e["step_losses"] for e in a.epochs] == [e["step_losses"] for e in b.epochs])


def printed_share(log: RunLog) -> Optional[float]:
    """The share `--da-host-share auto` printed at start-up."""
    found = re.search(r"--da-host-share auto: ([0-9.]+) of every epoch", log.stdout)
    return float(found.group(1)) if found else None


def profile_of(w: Workload, lay: Layout, probed: dict[str, float]) -> Any:
    """The performance model's profile of this layout from this process's measurements (on a CPU the
    CPU model: the step is the host's own work)."""
    from dpuoffload.common.plan.perfmodel import Profile

    on_gpu = lay.device == "cuda"
    n = lay.long_steps * w.batch
    return Profile(n_train=n, n_val=0, host_ranks=1, dpu_ranks=1, batch=w.batch, host_aug=probed["aug_s"],
                   host_train=0.0 if on_gpu else probed["step_s"] / w.batch, host_eval=0.0,
                   dpu_aug=probed["aug_s"] / lay.speed, dpu_train=0.0, dpu_eval=0.0, allreduce=0.0,
                   transfer=probed["memcpy_s"], host_workers=len(lay.host), dpu_workers=len(lay.dpu),
                   none_workers=len(lay.host), gpu_step=probed["step_s"] if on_gpu else 0.0,
                   h2d=probed["h2d_s"], host_cpu=probed["memcpy_s"] if on_gpu else 0.0)


def predictions(p: Any, lay: Layout) -> dict[str, Any]:
    """Predicted img/s of each variant, and the share `--da-host-share auto` would balance at."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share, predict

    def rate(mode: str, **over: Any) -> float:
        return p.n_train / predict(mode, replace(p, **over)).train_s

    return {"img_s": {"peer": rate("none"), "da": rate("da", host_share=0.0),
                      "share auto": rate("da", host_share=None), "share fixed": rate("da", host_share=lay.fixed_share),
                      "share 1.0": rate("da", host_share=1.0, dpu_workers=0)},
            "balanced_share": balanced_host_share(p)}


def analyze(w: Workload, lay: Layout, probed: dict[str, float], runs: dict[str, list[RunLog]],
            identity: Optional[dict[str, RunLog]]) -> dict[str, Any]:
    """One workload's rates, busy fractions, predictions, identity checks and targets."""
    ceiling = w.batch / probed["step_s"]
    rates = {v: spread([steady_rate(log, w.batch) for log in logs]) for v, logs in runs.items() if v not in SHORT}
    short = {v: spread([short_rate(log) for log in runs[v]]) for v in ("peer short", "ours short")}
    per_core = 1 / probed["aug_s"]
    pred = predictions(profile_of(w, lay, probed), lay)
    out = {"ceiling_img_s": ceiling, "per_core_img_s": per_core, "probe": probed, "img_s": rates, "short_img_s": short,
           "busy": {v: r["median"] / ceiling for v, r in rates.items()}, "predicted": pred,
           "auto_share": printed_share(runs["share auto"][0]), "fixed_share": lay.fixed_share,
           "auto_share_short": printed_share(runs["ours short"][0]),
           "identity": identity_report(runs, identity, lay), "needed_dpu_cores": needed_cores(ceiling, per_core, lay)}
    if "step_autotuned_s" in probed:
        out["ceiling_autotuned_img_s"] = w.batch / probed["step_autotuned_s"]
    if "step_no_read_s" in probed:
        out["ceiling_no_read_img_s"] = w.batch / probed["step_no_read_s"]
    if "auto" in runs:
        out["mode_auto"] = auto_report(runs["auto"][0])
    out["targets"] = targets(out, lay)
    out["jobs"] = {v: [job_summary(log, v, w.batch) for log in logs] for v, logs in runs.items()}
    return out


def identity_report(runs: dict[str, list[RunLog]], identity: Optional[dict[str, RunLog]],
                    lay: Layout) -> dict[str, bool]:
    """Which of ours trained on the peer's batches (`none`'s); fails the benchmark if any did not."""
    losses = lay.device == "cpu"  # a GPU's backward kernels may add in any order: batches only there
    if identity is not None:
        report = {"ours (host + DPU share) vs peer": same_training(identity["ours"], identity["peer"], losses),
                  "da uint8 (float steps on the device) vs peer": same_training(identity["uint8"], identity["peer"],
                                                                                losses)}
    else:
        report = {f"{v} vs peer": same_training(runs[v][0], runs["peer"][0], losses)
                  for v in ("da", "da uint8", "share auto", "share fixed", "share 1.0") if v in runs}
        report["ours short vs peer short"] = same_training(runs["ours short"][0], runs["peer short"][0], losses)
    bad = [k for k, ok in report.items() if not ok]
    if bad:
        sys.exit(f"gpu.py: not the same {'batches and losses' if losses else 'batches'}: {', '.join(bad)}")
    return report


def needed_cores(ceiling: float, per_core: float, lay: Layout) -> dict[str, int]:
    """DPU cores at speed s that keep the GPU >= 90 % busy: alone, and beside the h host cores."""
    want = TARGETS["busy"] * ceiling
    dpu_core = lay.speed * per_core
    return {"dpu_only": math.ceil(want / dpu_core),
            "beside_host_cores": max(0, math.ceil((want - len(lay.host) * per_core) / dpu_core))}


def auto_report(log: RunLog) -> dict[str, Any]:
    """What `--mode auto` measured, chose, and at which share (from its prediction)."""
    from dpuoffload.common.plan.perfmodel import Profile, predict

    rec = log.auto or {}
    if not rec:
        return {}
    chosen = rec["chosen"]
    detail = predict(chosen, Profile(**rec["profile"])).detail
    return {"chosen": chosen, "share": detail.get("host_share"), "predicted_epoch_s": rec["predicted"],
            "gpu_step_s": rec["profile"].get("gpu_step", 0.0), "measured_epoch_s": rec.get("measured_epoch_s")}


def targets(r: dict[str, Any], lay: Layout) -> list[dict[str, Any]]:
    """The issue's targets for one workload, each with its limit, value and verdict."""
    rates, s, d = {v: x["median"] for v, x in r["img_s"].items()}, lay.speed, len(lay.dpu)
    bound = min(r["ceiling_img_s"], rates["peer"] + s * d * r["per_core_img_s"])
    rows = [(f"{v} / min(GPU-bound, peer + s·d·core)", rates[v] / bound, "≥", TARGETS["share_vs_bound"])
            for v in ("share auto", "share fixed") if v in rates]
    rows += [
             ("share 1.0 / peer (same cores)", rates["share 1.0"] / rates["peer"], "≥", TARGETS["share1_vs_peer"]),
             ("ours short / ours long (share auto)", r["short_img_s"]["ours short"]["median"] / rates["share auto"],
              "≥", TARGETS["short_vs_long"])]
    for v in [v for v in ("da", "share auto", "share fixed") if v in rates]:
        err = r["predicted"]["img_s"][v] / rates[v] - 1
        rows.append((f"model prediction error, {v}", err, "within ±", TARGETS["prediction_error"]))
    return [{"target": t, "value": x, "limit": f"{op}{lim:g}" if op == "within ±" else f"{op} {lim:g}",
             "met": abs(x) <= lim if op == "within ±" else x >= lim} for t, x, op, lim in rows]


# ------------------------------------------------------------------------------------------- main
def measure(args: argparse.Namespace, lay: Layout, workloads: dict[str, Workload]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    partial: dict[str, Any] = {}
    for name, w in workloads.items():
        root = write_jpegs(w.size, lay.long_steps * w.batch, 10 if args.quick else 64)
        probed = probe(w, root, lay.device, 3 if args.quick else 20, lay.host[0])
        print(f"{name}: GPU-bound {w.batch / probed['step_s']:.0f} img/s, one core augments "
              f"{1 / probed['aug_s']:.0f} img/s", file=sys.stderr, flush=True)
        todo = chosen(variants(w, root, lay, args.quick), args.variants)
        runs: dict[str, list[RunLog]] = {v: [] for v in todo}
        for rep in range(args.reps):
            for v, fn in todo.items():
                runs[v].append(fn())
                print(f"rep {rep + 1}/{args.reps} {name} {v}: {job_line(runs[v][-1], v, w.batch, probed)}",
                      file=sys.stderr, flush=True)
                partial[name] = {"probe": probed, "jobs": {k: [job_summary(log, k, w.batch) for log in logs]
                                                          for k, logs in runs.items()}}
                write_json(partial_path(args.out), {"partial": True, "report": partial})  # (kept if cut short)
        if args.variants:  # a part of the table: its rates, no targets (they compare variants left out)
            report[name] = {"ceiling_img_s": w.batch / probed["step_s"], "per_core_img_s": 1 / probed["aug_s"],
                            **partial[name]}
            continue
        identity = None if lay.digests else identity_runs(w, root, lay)
        report[name] = analyze(w, lay, probed, runs, identity)
    return report


def partial_path(out: Path) -> Path:
    """Where the jobs' results so far go while the run goes on (beside `--out`, which keeps the last
    whole run's until this one ends; removed then)."""
    return out.with_name(out.stem + ".partial.json")


def chosen(todo: dict[str, Any], names: Optional[Sequence[str]]) -> dict[str, Any]:
    """The variants `--variants` names (all by default), in the benchmark's order."""
    if not names:
        return todo
    unknown = sorted(set(names) - set(todo))
    if unknown:
        sys.exit(f"gpu.py: --variants {' '.join(unknown)}: not a variant of this run; choose from "
                 f"{', '.join(repr(v) for v in todo)}")
    return {v: fn for v, fn in todo.items() if v in names}


def job_summary(log: RunLog, variant: str, batch: int) -> dict[str, Any]:
    """One job's rate and where its wall time went: host rank 0's start-up (its process's start to
    its training: imports, MPI, the start-up sequence, data and model, a `--mode auto` profile; its
    parts from the end record's `startup_parts_s`), the epochs' training (and their first step, which
    waits for the first batch), their validation, and the rest (dpurun and mpirun, the ranks' teardown)."""
    rate = short_rate(log) if variant in SHORT else steady_rate(log, batch)
    train = sum(e["train_time"] for e in log.epochs)
    val = sum(e["epoch_time"] - e["train_time"] for e in log.epochs)
    end = log.end or {}
    startup = float(end.get("startup_s", 0.0))
    return {"img_s": rate, "train_s": train, "wall_s": log.wall, "startup_s": startup, "val_s": val,
            "other_s": log.wall - train - val - startup, "startup_parts_s": end.get("startup_parts_s", {}),
            "first_step_s": first_step(log)}


def first_step(log: RunLog) -> float:
    """The training's first step, with the first batch's wait in it: the loader's opening (the numerics
    check, the DPU rank's data set) and the pipeline's filling, which a short job pays once."""
    steps = log.host[0].get("step_times", []) if log.host else []
    return float(steps[0]) if steps else 0.0


def largest_parts(parts: dict[str, float], n: int = 3) -> str:
    """The `n` largest parts of a start-up, as "data sets 1.5 s, ..."; "" without parts."""
    return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])[:n])


def job_line(log: RunLog, variant: str, batch: int, probed: dict[str, float]) -> str:
    j = job_summary(log, variant, batch)
    what = "short epochs" if variant in SHORT else "steady"
    parts = largest_parts(j["startup_parts_s"])
    return (f"{j['img_s']:.0f} img/s {what} ({j['img_s'] * probed['step_s'] / batch:.2f} of GPU-bound); job "
            f"{j['wall_s']:.0f} s: start-up {j['startup_s']:.1f} s{f' ({parts})' if parts else ''}, training "
            f"{j['train_s']:.1f} s (its first step {j['first_step_s']:.1f} s), validation {j['val_s']:.1f} s, launch "
            f"and teardown {j['other_s']:.1f} s")


def markdown(report: dict[str, Any], lay: Layout, args: argparse.Namespace) -> str:
    h, d, s = len(lay.host), len(lay.dpu), lay.speed
    out = [f"Device {lay.device}; host rank and its workers on {h} core(s) ({_list(lay.host)}), {d} DPU core(s) "
           f"({_list(lay.dpu)}) at speed {s:g}; bf16 autocast, channels_last; long epoch {lay.long_steps} batches "
           f"(steady state: its second half), short epochs {lay.short_steps} batches ({lay.short_epochs} epochs, "
           f"2.. measured); {args.reps} repetition(s), medians. GPU busy = img/s / GPU-bound img/s (trainer "
           "settings)." + (" **--quick on a CPU: a smoke run of the plumbing; no number here says anything "
                           "about a GPU.**" if args.quick else "")]
    for name, r in report.items():
        if "targets" not in r:  # --variants
            out += ["", f"**{name}** (--variants: no targets) — GPU-bound {r['ceiling_img_s']:.0f} img/s, one core "
                        f"augments {r['per_core_img_s']:.0f} img/s", "", _jobs_table(r)]
            continue
        out += ["", f"**{name}** — one core augments {r['per_core_img_s']:.0f} img/s; ours trained on the peer's "
                    f"batches ({', '.join(r['identity'])})", "", _rows_table(r, lay), "", _targets_table(r),
                "", _notes(name, r, lay), "", "Where each job's time went:", "", _jobs_table(r)]
    return "\n".join(out)


def _rows_table(r: dict[str, Any], lay: Layout) -> str:
    h, d = len(lay.host), len(lay.dpu)
    pred, busy, rates = r["predicted"]["img_s"], r["busy"], r["img_s"]
    rows = [["GPU-bound (synthetic batches on the device, deterministic)", "-", f"{r['ceiling_img_s']:.0f}", "1.00",
             "-", "-"]]
    if "ceiling_autotuned_img_s" in r:
        rows.append(["GPU-bound, cuDNN autotuned, not deterministic", "-", f"{r['ceiling_autotuned_img_s']:.0f}",
                     f"{r['ceiling_autotuned_img_s'] / r['ceiling_img_s']:.2f}", "-", "-"])
    if "ceiling_no_read_img_s" in r:
        rows.append(["GPU-bound, no loss read at all (the trainer reads each a step later)", "-",
                     f"{r['ceiling_no_read_img_s']:.0f}", f"{r['ceiling_no_read_img_s'] / r['ceiling_img_s']:.2f}",
                     "-", "-"])
    pin = ", pin_memory" if lay.device == "cuda" else ""
    names = {"peer": f"peer: DataLoader(num_workers={h}{pin}, prefetch 4)",
             "da": f"ours da, {d} DPU cores (--dpu-workers {d})",
             "da uint8": f"ours da, {d} DPU cores, --wire uint8 (float steps on the "
                         f"{'GPU' if lay.device == 'cuda' else 'host'})",
             "share auto": f"ours host + DPU, --da-host-share auto (picked {r['auto_share']})",
             "share fixed": f"ours host + DPU, share {r['fixed_share']} (h / (h + s·d))",
             "share 1.0": f"ours share 1.0 ({h} host workers, no DPU)"}
    cores = {"peer": f"{h}", "da": f"0 + {d}", "da uint8": f"0 + {d}", "share auto": f"{h} + {d}",
             "share fixed": f"{h} + {d}", "share 1.0": f"{h}"}
    for v, label in names.items():
        if v not in rates:
            continue
        short = {"peer": "peer short", "share auto": "ours short"}.get(v)
        s = f"{r['short_img_s'][short]['median']:.0f}" if short else "-"
        rows.append([label, cores[v], f"{rates[v]['median']:.0f}", f"{busy[v]:.2f}", s,
                     f"{pred[v]:.0f}" if v in pred else "-"])
    return table(["variant", "host + DPU cores", "img/s (long, steady)", "GPU busy", "img/s (short epochs)",
                  "model img/s"], rows)


def _jobs_table(r: dict[str, Any]) -> str:
    rows = [[v, f"{j['img_s']:.0f}", f"{j['img_s'] / r['ceiling_img_s']:.2f}", f"{j['train_s']:.1f}",
             f"{j['first_step_s']:.1f}", f"{j['startup_s']:.1f}", largest_parts(j["startup_parts_s"]),
             f"{j['wall_s']:.0f}"]
            for v, jobs in r["jobs"].items() for j in jobs]
    return table(["variant", "img/s", "GPU busy", "training s", "its first step s", "start-up s",
                  "start-up's largest parts", "job s"], rows)


def _targets_table(r: dict[str, Any]) -> str:
    rows = [[t["target"], t["limit"], f"{t['value']:+.1%}" if "error" in t["target"] else f"{t['value']:.3f}",
             "met" if t["met"] else "missed"] for t in r["targets"]]
    return table(["target", "limit", "measured", ""], rows)


def _notes(name: str, r: dict[str, Any], lay: Layout) -> str:
    n = r["needed_dpu_cores"]
    lines = [f"- Peer short / long: {r['short_img_s']['peer short']['median'] / r['img_s']['peer']['median']:.2f} "
             f"(the issue measured 0.40 on the H100 node).",
             f"- Share: `--da-host-share auto` picked {r['auto_share']} (short-epoch run: {r['auto_share_short']}), "
             f"the model balances at "
             f"{r['predicted']['balanced_share']}, counting cores gives {r['fixed_share']}.",
             f"- DPU cores at speed {lay.speed:g} to keep the {'GPU' if lay.device == 'cuda' else 'device'} "
             f"≥ 90 % busy on {name}: {n['dpu_only']} alone, {n['beside_host_cores']} beside the "
             f"{len(lay.host)} host cores (from {r['per_core_img_s']:.0f} img/s per core and the GPU-bound "
             f"{r['ceiling_img_s']:.0f} img/s)."]
    auto = r.get("mode_auto")
    if auto:
        step = f"its profile's GPU step {auto['gpu_step_s'] * 1e3:.1f} ms" if auto["gpu_step_s"] else "a CPU profile"
        lines.append(f"- `--mode auto` chose {auto['chosen']} (share {auto['share']}; {step}): predicted "
                     f"{auto['predicted_epoch_s'][auto['chosen']]:.2f} s, measured {auto['measured_epoch_s']:.2f} s "
                     "for its second epoch (half the long epoch's batches).")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "gpu", "resnet50 on 32 px crops of tiny JPEGs, batch 8, 1 + 1 cores, a CPU smoke run",
                     reps=1, epochs=False, plots=False)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the host rank trains (default: auto, cuda when torch sees a GPU)")
    p.add_argument("--workloads", nargs="+", choices=tuple(WORKLOADS), default=None,
                   help="default: resnet50 shufflenet_v2 (--quick: resnet50)")
    p.add_argument("--host-cores", type=int, default=8, help="cores of the host rank and its workers (default: 8)")
    p.add_argument("--dpu-cores", type=int, default=8, help="emulated DPU cores (default: 8)")
    p.add_argument("--long-steps", type=int, default=40, help="batches of the long epoch (default: 40)")
    p.add_argument("--short-steps", type=int, default=8, help="batches of each short epoch (default: 8)")
    p.add_argument("--short-epochs", type=int, default=4, help="short epochs, the first not measured (default: 4)")
    p.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                   help="run only these variants (e.g. peer da 'share auto'; default: all): for a GPU lease too "
                        "short for the whole table; the targets need the variants they compare, the batch-identity "
                        "runs are left out")
    return p


def layout(args: argparse.Namespace) -> Layout:
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu.py: --device cuda, but torch sees no GPU here; use --device cpu (a smoke run) or a GPU node")
    if args.quick:
        args.host_cores, args.dpu_cores, args.dpu_speed = 1, 1, QUICK_DPU_SPEED
        args.long_steps, args.short_steps, args.short_epochs = 6, 2, 3
    host, dpu = cores_of(args)
    return Layout(host, dpu, args.dpu_speed, device, args.long_steps, args.short_steps, args.short_epochs,
                  digests=args.quick)


def run(args: argparse.Namespace) -> Section:
    lay = layout(args)
    names = args.workloads or (["resnet50"] if args.quick else list(WORKLOADS))
    workloads = {n: (QUICK_WORKLOADS if args.quick else WORKLOADS)[n] for n in names}
    report = measure(args, lay, workloads)
    payload = {"machine": machine(), "settings": settings(args), "layout": asdict(lay), "report": report}
    write_json(args.out, payload)
    partial_path(args.out).unlink(missing_ok=True)
    return Section("gpu", payload, markdown(report, lay, args))


def main() -> int:
    print(run(build_parser().parse_args()).markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

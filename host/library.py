"""The public host-side API behind `import dpuoffload`: `init()` and the `Job` it returns.

A user's training script, launched by `dpurun -- [--mode da] train.py [its own args]`, runs on the
host ranks; the DPU ranks run the DPU program, which serves what the script asks for
(`dpu.serve`). `init()` runs the same start-up sequence as the built-in trainer (roles, the
version/config handshake with the DPU ranks, the offload plan), so a mismatch or a bad flag still
ends every rank with one line. After it, the script is in charge: its own model, optimizer, loss,
allreduce and loop; the job only hands out loaders and, at the end, releases the DPU ranks.

Started without dpurun (`python train.py`, `torchrun`, `horovodrun`), `init()` warns once and
returns a local job: `job.loader` then loads in the calling process, with the same batches, so one
script runs with and without DPUs.

Failures: an exception that escapes the script on a host rank ends the whole job with the one-line
error of the built-in programs (a DPU rank waiting for a batch request must not hang), and a
script that returns without `job.finish()` finishes at exit.
"""

from __future__ import annotations

import atexit
import functools
import os
import shlex
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Protocol, Sequence, TypeVar, cast

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.loaders import Sampling, steps_for
from dpuoffload.common.data.streams import Recipe, StepSplit
from dpuoffload.common.data.wire import choose
from dpuoffload.common.data.wire import policy as wire_policy
from dpuoffload.common.errors import ConfigError, InternalError
from dpuoffload.common.faults.abort import JobFailed, abort_job, failure_line, set_rank_label
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.modes import Device, Mode, Wire
from dpuoffload.common.plan.offload import OffloadPlan, plan_offload, require_feeder
from dpuoffload.common.runtime import env
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.startup import start_program
from dpuoffload.common.state.load import Live
from dpuoffload.host.checkpoint import StateHandoff
from dpuoffload.host.control import end_with_dpus
from dpuoffload.host.loader import (
    DpuLoader,
    FallbackSource,
    HostPart,
    RemoteSource,
    SharedSource,
    check_dataset,
    local_loader,
)
from dpuoffload.host.numerics import NumericsCheck, numerics_check
from dpuoffload.host.script_state import Restored, ScriptState
from dpuoffload.host.validation import JobValidation

if TYPE_CHECKING:
    import torch
    from mpi4py import MPI
    from torch.utils.data import Dataset

    from dpuoffload.host.lightning import HostRanks
    from dpuoffload.host.recovery.spares import SparePool


class MapStyleDataset(Protocol):
    """What `job.loader` and `job.validate` index besides a torch `Dataset` (whose type declares no
    length, though the loader needs one): any map-style data set, a list of samples included. A
    sample is anything the batches' collation takes: typically (image tensor, label)."""

    def __getitem__(self, index: int, /) -> object: ...

    def __len__(self) -> int: ...


_Record = TypeVar("_Record")


class ShardStream(Protocol[_Record]):
    """A stream `job.loader` trains from (docs/batches.md, "Streams"): it names its shards, opens
    one (its records in order, the same every time) and makes a record a sample. `_Record` is the
    stream's own record type: what `open_shard` yields is what `sample` takes."""

    @property
    def shards(self) -> Sequence[str]: ...

    def open_shard(self, shard: str, /) -> Iterable[_Record]: ...

    def sample(self, record: _Record, /) -> object: ...


class Scheduler(Protocol):
    """A learning-rate scheduler as `job.checkpoint` / `job.restore` keep it (any of
    `torch.optim.lr_scheduler`'s, or your own): its state as plain data, and that state put back."""

    def state_dict(self) -> Mapping[str, object]: ...

    def load_state_dict(self, state_dict: dict[str, object], /) -> None: ...


# Environment variables of launchers that start one process per rank, for the fallback's rank count.
_RANK_VARS = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"), ("PMI_SIZE", "PMI_RANK"), ("WORLD_SIZE", "RANK"))
# The job `init()` returned (or `attach` made): the public API's one handle per process, as
# `hvd.init()` or torch.distributed's default group are. It is what `init()` hands back on a second
# call and what `current()` returns; nothing internal is stored on it from outside.
_job: Optional["Job"] = None
_at_exit = False  # finish() runs from the exit hooks (its errors cannot be raised there)


class Job:
    """This host rank's handle on the job: loaders, the host ranks' communicator, and the end.

    Attributes:
        rank: this host rank (0 .. size-1); what `hvd.rank()` or `dist.get_rank()` would be.
        size: the number of host ranks (training replicas).
        mode: the offload mode (`dpurun -- --mode ...`); `none` when started without dpurun.
        offloaded: whether DPU ranks build this rank's batches.
        comm: the host ranks' mpi4py communicator (give it to `hvd.init(comm=job.comm)`: Horovod over
            COMM_WORLD would take the DPU ranks for training replicas), or None without MPI.
        is_clone: this process is a clone rank (`dpurun --clone-ranks M`, `--clone-at N`): its
            `job.restore` waits for the host ranks' state of step N; rank, size and comm are then
            the clone group's.
    """

    def __init__(self, rank: int, size: int, mode: Mode, comm: Optional["MPI.Comm"] = None,
                 topo: Optional[Topology] = None, cfg: Optional[RunConfig] = None,
                 plan: Optional[OffloadPlan] = None, *, faults: Optional[Faults] = None,
                 fed_as: Optional[int] = None, handoff: Optional[StateHandoff] = None) -> None:
        """`faults`: the run's failure record (`Started.run.faults`; inert without one: a local job).
        `fed_as`: a spare in a dead host rank's seat (`host.spare`): that rank's world
        rank, whose DPU rank feeds this job's loaders. `handoff`: where `job.checkpoint` sends the
        state (under dpurun with --ckpt-dir or a clone to serve; None: nothing is written)."""
        self.rank, self.size, self.mode, self.comm = rank, size, mode, comm
        self.topo, self.cfg, self.plan = topo, cfg, plan
        self.faults = faults if faults is not None else Faults.inert()
        self.fed_as = fed_as
        self.loaders: list[DpuLoader] = []
        self.validation: Optional[JobValidation] = None
        self.state = ScriptState(rank, size, topo, cfg, handoff)  # job.checkpoint / job.restore
        self.is_clone = self.state.is_clone
        self.warned: set[str] = set()
        self.exit_code = 0
        self.finished = False

    @property
    def device(self) -> "torch.device":
        """The device this host rank should train on: `--device` (default auto: its own GPU, by its
        rank among the host ranks of its node, when torch sees one; else the CPU). The batches of
        `job.loader` arrive in host memory; move them with `.to(job.device, non_blocking=True)`."""
        from dpuoffload.common.train.device import resolve_device

        requested = self.cfg.device if self.cfg is not None else Device.AUTO
        return resolve_device(requested, self.topo.local_rank if self.topo is not None else 0)

    @functools.cached_property
    def numerics(self) -> Optional[NumericsCheck]:
        """`--numerics`: the check each loader a DPU rank feeds runs when it opens (None: off)."""
        topo, cfg = cast(Topology, self.topo), cast(RunConfig, self.cfg)
        return numerics_check(cfg.numerics, cfg.numerics_samples, topo.describe(), cfg.log_dir, topo.world_rank,
                              loud=self.rank == 0)

    @property
    def wire_policy(self) -> Wire:
        """`--wire` for this rank's loaders (`wire.policy`: `auto` on a GPU means float)."""
        return wire_policy(cast(RunConfig, self.cfg).wire, on_gpu=self.device.type == "cuda")

    @property
    def offloaded(self) -> bool:
        """Whether DPU ranks build this rank's batches (never on a clone rank: it loads its own)."""
        return self.topo is not None and not self.is_clone and self.mode.augments_on_dpu

    def loader(self, dataset: "Dataset[object] | MapStyleDataset | ShardStream[_Record]", batch_size: int, *,
               shuffle: bool = True, seed: int = 0, drop_last: bool = False, copy: bool = True,
               epochs: Optional[int] = None,
               build_on_dpu: Optional[Callable[[], "Dataset[object] | MapStyleDataset"]] = None,
               host_steps: Optional[int] = None) -> DpuLoader:
        """A loader of `dataset` for this host rank, augmented by its DPU rank in `--mode da`/`hybrid`.

        Args:
            dataset: a map-style data set with its transforms (the user's own, unchanged). In `da`
                it is pickled once to the DPU rank: transforms must pickle (no lambdas), as for a
                DataLoader with workers under the spawn start method.
            batch_size: samples per batch on this host rank.
            shuffle, seed: the `DistributedSampler`'s; `seed` also seeds each sample's augmentation
                (`seeded`), so a sample is augmented the same wherever it is.
            drop_last: drop this rank's last partial batch of an epoch.
            copy: False hands out views of the receive buffers, valid until the next batch is asked
                for (saves one copy per batch; keep nothing across steps then). On a GPU host rank
                the buffers, and the copies made with True, are pinned memory.
            epochs: the epochs you will iterate, if known: the DPU rank then stops running ahead
                after the last one (else it makes up to --da-buffers batches of an epoch never asked for).
            build_on_dpu: a picklable zero-argument callable (a module-level function, or a
                `functools.partial` of one) that builds the same data set on the DPU rank, sent instead
                of `dataset` itself: for data sets held in memory (CIFAR-10's arrays are 150 MB).
            host_steps: the last k steps of the data set's torchvision Compose that this host rank runs on
                each batch, while the DPU rank runs the others and sends uint8 images (`--wire`); only
                element-wise float steps (ToTensor, ConvertImageDtype, ToDtype, Normalize) can go, so the
                batches stay bit-identical. None: `--wire` decides (auto: all such trailing steps); 0: none.

        No communication happens here: the DPU rank hears of the loader with the first batch request.
        """
        self._check_open()
        checked = check_dataset(dataset, batch_size)
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
            raise ConfigError(f"job.loader: epochs must be an integer >= 1 or None, got {epochs!r}")
        sampling = Sampling(batch_size, self.size, self.rank, seed, shuffle, drop_last,
                            self.cfg.skip_corrupt if self.cfg is not None else 0)
        if not self.offloaded:
            made = local_loader(checked, sampling, epochs)
        else:
            made = self._remote_loader(checked, sampling, copy, epochs, build_on_dpu, host_steps)
        self.loaders.append(made)
        return made

    def _remote_loader(self, dataset: Any, sampling: Sampling, copy: bool, epochs: Optional[int],
                       build_on_dpu: Optional[Callable[[], "Dataset[object] | MapStyleDataset"]],
                       host_steps: Optional[int]) -> DpuLoader:
        topo, cfg, plan = cast(Topology, self.topo), cast(RunConfig, self.cfg), cast(OffloadPlan, self.plan)
        feeder = require_feeder(plan, topo.world_rank if self.fed_as is None else self.fed_as, topo.describe())
        wire = choose(dataset, self.wire_policy, host_steps, sampling)  # (uint8: the host runs the float steps)
        steps = steps_for(dataset, sampling)
        if isinstance(cfg.da_host_share, str):
            raise InternalError("--da-host-share auto unresolved after start-up (`common.startup` resolves it)")
        split = StepSplit(cfg.da_host_share, steps)
        remote = RemoteSource(topo.world, feeder, topo.describe(feeder), len(self.loaders), wire.layout, steps,
                              cfg.peer_timeout, copy, epochs, split, pinned=self.device.type == "cuda",
                              remote=topo.on_other_machine(feeder))
        remote.prepare(dataset if build_on_dpu is None else Recipe(build_on_dpu), sampling, wire, self.numerics)
        source: RemoteSource | SharedSource | FallbackSource  # (each a `Source`; FallbackSource wraps one of the two)
        source = remote
        where = topo.describe(feeder)
        if cfg.da_host_share:
            source = SharedSource(remote, HostPart(dataset, sampling, split, cfg.da_host_workers, epochs))
            where = f"{topo.describe(feeder)} and this host rank ({split.owned(host=True)} of {steps} steps)"
        if cfg.recovery_policy.survives_dpu_loss or self.fed_as is not None:  # (a dead feeder: this rank loads from the
            # step that did not come; a spare's feeder may have died with the rank whose seat it takes)
            source = FallbackSource(source, dataset, sampling, steps, cfg.da_host_workers, epochs, topo.describe(),
                                    self.faults)
        return DpuLoader(source, sampling, steps, dataset, where, epochs)

    def validate(self, model: "torch.nn.Module", val_set: "Dataset[object] | MapStyleDataset", epoch: int, *,
                 batch_size: int = 128) -> dict[int, dict[str, float]]:
        """Validate `model` as it is now, the end of epoch `epoch`: cross-entropy loss and accuracy.

        Collective over the host ranks. In `--mode mv`/`hybrid` each host rank hands its slice of
        the model state to the DPU validation ranks and goes on training while they evaluate (the
        first call also sends them the model and `val_set`, pickled: pass the same two objects every
        epoch, and the bare model, not a DDP wrapper); elsewhere the host ranks evaluate their
        shards now. Either way the model's buffers become host rank 0's first (as DDP does) and
        the sums are the same. Returns, on host rank 0, the results that have arrived so far
        ({epoch: {"loss", "accuracy", "count"}}; a DPU rank's result for epoch i usually arrives
        during epoch i+1, and `finish()` returns them all); other host ranks get {}.
        """
        self._check_open()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"job.validate: batch_size must be an integer >= 1, got {batch_size!r}")
        data = cast("Dataset[object]", val_set)  # (JobValidation's `Dataset`: any map-style set, indexed and sized)
        if self.validation is None:
            share = float(self.cfg.mv_dpu_fraction) if self.cfg is not None else 0.0
            on_dpu = self.topo is not None and not self.is_clone and self.mode.validates_on_dpu
            self.validation = JobValidation(model, data, batch_size, self.comm, self.topo,
                                            self.plan if on_dpu else None,
                                            share, self.cfg.peer_timeout if self.cfg else 600.0, self.faults)
        self.validation.check_same(model, data)
        self.validation.epoch_end(epoch)
        return dict(self.validation.results)

    def checkpoint(self, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                   scheduler: Optional[Scheduler] = None, *, epoch: int, step: int = 0,
                   global_step: Optional[int] = None, extra: Optional[dict[str, object]] = None) -> None:
        """Hand the training state to the DPU ranks, which write it as a checkpoint while you train on.

        Collective over the host ranks: every host rank calls it at the same point, right after an
        optimizer step (the parameters and optimizer state must be identical on all of them, as your
        allreduce makes them). Each host rank sends 1/N of the parameters and optimizer state plus
        its own BatchNorm buffers and RNG states; its keeper DPU rank writes the files and commits
        (`--ckpt-dir`, `--ckpt-keep`, `--ckpt-copy`, README "Checkpoints"). Returns once this rank's
        bytes are staged (`--ckpt-copy staged`, default) or received (`zero`).

        Args:
            model, optimizer, scheduler: the live objects (the bare model, not a DDP wrapper); any
                torch optimizer; any scheduler whose `state_dict()` is plain data, or None.
            epoch, step: where training stands: `step` batches of `epoch` are done (`step=0` at the
                start of `epoch`, so the end of epoch e is `epoch=e + 1`). `job.restore` returns them.
            global_step: a count that grows with every checkpoint (names its directory); default
                `epoch * len(first loader) + step`.
            extra: your own JSON data (best accuracy, a counter, ...), returned by `job.restore`.

        Without `--ckpt-dir` (or without dpurun) nothing is written: one warning says so.
        """
        self._check_open()
        position = self.state.position(epoch, step, global_step, len(self.loaders[0]) if self.loaders else None)
        unwritten = self.state.checkpoint(Live(model, optimizer, scheduler), position, extra)
        if unwritten:
            self._warn_once("checkpoint", unwritten)

    def restore(self, model: "torch.nn.Module", optimizer: "torch.optim.Optimizer",
                scheduler: Optional[Scheduler] = None) -> Optional[Restored]:
        """Load the checkpoint named by dpurun's `--resume latest|DIR` into your live objects.

        Returns None without `--resume` (start from scratch), else where to go on: iterate
        `loader.epoch(r.epoch, start=r.step)` first, then the following epochs. The same host rank
        count restores each rank's own BatchNorm buffers and RNG states (bit-exact: the resumed run's
        losses equal the uninterrupted run's); another count takes host rank 0's, and scales a
        mid-epoch step by the ratio of host counts (the samples per step changed with it).
        Not collective: every host rank reads the checkpoint's files itself.
        """
        self._check_open()
        return self.state.restore(Live(model, optimizer, scheduler))

    def init_process_group(self, backend: str = "gloo", timeout: Optional[float] = None) -> None:
        """`torch.distributed.init_process_group` over the host ranks only (for DDP).

        The rendezvous address is agreed over `job.comm`, so no MASTER_ADDR/PORT is needed; a
        plain `init_process_group()` from torchrun's environment would not exist under dpurun.
        """
        from dpuoffload.common.train.allreduce import init_torch_group

        if self.comm is None:
            raise ConfigError("job.init_process_group needs MPI: start the script with dpurun (or mpirun)")
        init_torch_group(self.comm, backend, timeout or (self.cfg.peer_timeout if self.cfg else 600.0))

    def lightning_environment(self, backend: str = "gloo") -> "HostRanks":
        """A Lightning `ClusterEnvironment` of the host ranks, for `DDPStrategy(cluster_environment=...)`.

        Collective over the host ranks: forms the process group (`init_process_group(backend)`) if
        the script has not. Without it, Lightning would see Open MPI and take the DPU ranks for
        training replicas too. Needs the `lightning` package.
        """
        self._check_open()
        try:
            from dpuoffload.host.lightning import host_ranks
        except ImportError as e:
            raise ConfigError(f"job.lightning_environment needs PyTorch Lightning ({e}): pip install lightning") \
                from None
        return host_ranks(self, backend)

    def finish(self) -> dict[int, dict[str, float]]:
        """Close every loader, wait for outstanding validations, release the DPU ranks; call once,
        on every host rank, at the end. Returns every epoch's validation results (host rank 0).

        Collective over the host ranks (a barrier: host rank 0 tells the DPU ranks to stop only
        after every host closed its loaders, and none returns before every DPU rank has answered,
        `host.control.end_with_dpus`). Called at exit if the script does not.
        """
        return self.finish_over(None, None)

    def finish_over(self, group: Optional[HostGroup],
                    spares: Optional["SparePool"]) -> dict[int, dict[str, float]]:
        """`finish` for the built-in host program under --recovery, which passes what it built after
        start-up: `group`, the host ranks as they are now (the barrier runs over the living ones;
        None: `job.comm`), and under rollback `spares`, whose spares still standing by leave after it."""
        if self.finished:
            return dict(self.validation.results) if self.validation else {}
        self.state.check_clone_served()
        self.finished = True
        for made in self.loaders:
            made.close()
        results = self.validation.finish() if self.validation is not None else {}
        handoff = self.state.handoff
        if handoff is not None:  # END to the keeper; host rank 0 gets keeper 0's summary
            handoff.finish()
        if self.topo is not None and self.cfg is not None:
            barrier = FixedGroup.of_side(self.topo) if group is None else group
            barrier.Barrier()
            self.faults.ending()  # (every host rank is done: ranks that leave now are not dying)
            if spares is not None:  # the spares still standing by leave too
                spares.release()
            if not self.is_clone:  # (the clone group needs the DPU ranks no more once it has the state)
                end_with_dpus(self.topo, self.cfg.peer_timeout, self.faults, barrier)
        if handoff is not None:
            self.exit_code = handoff.exit_code()  # host rank 0 prints the line of lost checkpoints
        if self.exit_code and not _at_exit:
            raise SystemExit(self.exit_code)
        return dict(results)

    def _finish_at_exit(self) -> None:
        """`finish` from the exit hooks, where neither an exit code (lost checkpoints) nor an error
        (a clone never served) can be raised: the error ends the job in one line, as the excepthook
        would, instead of an ignored traceback and ranks left waiting."""
        global _at_exit
        _at_exit = True
        try:
            self.finish()
        except Exception as e:  # noqa: BLE001 - any error here would be swallowed by the interpreter
            abort_job(failure_line(e), 1)
        if self.exit_code:
            from dpuoffload.common.runtime.fastexit import exit_now

            exit_now(self.exit_code)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned and self.rank == 0:
            warnings.warn(message, RuntimeWarning, stacklevel=3)
        self.warned.add(key)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.finish()

    def _check_open(self) -> None:
        if self.finished:
            raise ConfigError("job.finish() was called: this job hands out no more loaders")


def attach(cfg: RunConfig, topo: Topology, plan: OffloadPlan, faults: Faults) -> Job:
    """The built-in host program's job (its start-up already ran): the same API a script uses."""
    global _job
    _job = Job(topo.side_rank, len(topo.host_ranks), cfg.mode, topo.side_comm, topo, cfg, plan, faults=faults)
    return _job


def current() -> Job:
    """The job `init` or `attach` made in this process."""
    if _job is None:
        raise ConfigError("no dpuoffload job in this process: call dpuoffload.init() first")
    return _job


def init() -> Job:
    """Join the job as a host rank: roles, the handshake with the DPU ranks, the offload plan.

    Call once per process, before building loaders. Collective over every rank of the job under
    dpurun. Started without dpurun, returns a local job (with a warning): same batches, loaded here.
    """
    global _job
    if _job is not None:
        return _job
    argv = os.environ.get(env.SCRIPT_ARGS)
    _job = _local_job() if argv is None else _dpurun_job(shlex.split(argv))
    return _job


def _dpurun_job(argv: list[str]) -> Job:
    set_rank_label("host program")
    _install_failure_hooks()
    try:
        started = start_program(Role.HOST, argv, lambda cfg, topo, _: plan_offload(topo.ranks, cfg), lambda *_: {})
    except JobFailed:  # a collective start-up step failed on some rank: world rank 0 printed why, all exit
        sys.exit(1)
    cfg, topo = started.cfg, started.topo
    if topo.role is Role.DPU:
        abort_job(f"{topo.describe()}: a training script runs on host and clone ranks only (app contexts 0 and "
                  "2); start it with dpurun, which puts the DPU program in context 1")
    faults = started.run.faults
    hands_off = topo.role is Role.HOST and (cfg.checkpointing or (cfg.clone_at is not None and topo.clone_ranks))
    job = Job(topo.side_rank, len(topo.side_ranks(topo.role)), cfg.mode, topo.side_comm, topo, cfg, started.state,
              faults=faults, handoff=StateHandoff(cfg, topo, faults, None, None, None, None) if hands_off else None)
    _default_horovod_comm(topo.side_comm)
    atexit.register(job._finish_at_exit)
    if topo.role is Role.HOST and topo.side_rank == 0:
        clones = f", {len(topo.clone_ranks)} clone rank(s)" if topo.clone_ranks else ""
        print(f"[dpuoffload] mode {cfg.mode}: {len(topo.host_ranks)} host rank(s), {len(topo.dpu_ranks)} DPU "
              f"rank(s){clones}, script {cfg.script}", flush=True)
    return job


def _default_horovod_comm(comm: "MPI.Comm") -> None:
    """Make a plain `hvd.init()` mean the host ranks, if the script imported Horovod already.

    Under dpurun COMM_WORLD also holds the DPU ranks, which never join Horovod, so `hvd.init()`
    over it waits forever. `hvd.init(comm=job.comm)` is the documented call; a script that keeps
    its `hvd.init()` (imported at its top, as usual) gets the host ranks' communicator as the
    default here instead of a hang. A `comm` the script passes is used unchanged.
    """
    hvd: Any = sys.modules.get("horovod.torch")  # (Horovod has no type information)
    if hvd is None or getattr(hvd.init, "_dpuoffload_default", False):
        return
    original = hvd.init

    def init(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("comm") is None:  # (comm is Horovod's first parameter)
            kwargs["comm"] = comm
        return original(*args, **kwargs)

    init._dpuoffload_default = True  # type: ignore[attr-defined]
    hvd.init = init


def _local_job() -> Job:
    """No dpurun: the loader loads here; rank and size from the launcher's environment, if any."""
    size, rank = 1, 0
    for size_var, rank_var in _RANK_VARS:
        if size_var in os.environ and rank_var in os.environ:
            size, rank = int(os.environ[size_var]), int(os.environ[rank_var])
            break
    warnings.warn("dpuoffload: not started by dpurun, so there are no DPU ranks: batches are loaded and "
                  "augmented in this process. Launch with `dpurun -- --mode da SCRIPT [ARGS]` to offload them",
                  RuntimeWarning, stacklevel=3)
    comm = None
    if size > 1 and ("OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ):
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    return Job(rank, size, Mode.NONE, comm)


def _install_failure_hooks() -> None:
    """An exception that escapes the script (main thread or another) ends the whole job in one line."""
    def on_error(kind: type[BaseException], e: BaseException, tb: Any) -> None:
        if isinstance(e, KeyboardInterrupt):
            abort_job("host program: interrupted", 130)
        abort_job(failure_line(e), 1)  # (the full traceback goes to errors-rank<N>.txt)

    def on_thread_error(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            abort_job(failure_line(args.exc_value), 1)

    sys.excepthook = on_error
    threading.excepthook = on_thread_error

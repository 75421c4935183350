"""The offload modes (`--mode`), one enum, and what each one asks of the DPU ranks; and the numerics
policy (`--numerics`), what a difference between DPU-built and host-built samples does, and the
wire (`--wire`), what DPU ranks send; and how a checkpoint's slice leaves the weights' memory
(`--ckpt-copy`); and the training flags whose values are a fixed set (`--allreduce`, `--device`,
`--amp`, `--lr-schedule`, `--ckpt-errors`).

Code asks a mode what it does (`Mode.DA.augments_on_dpu`) instead of comparing strings, so a new
mode is added here once. `Mode` is a `str` enum: configs stay JSON-serialisable and hash the same,
and `Mode("da")` parses a flag value. So are the others (`FlagValue`): `RunConfig` turns the flag's
string into the member, and a member still equals its string (`AllReduce.MPI == "mpi"`).
"""

from __future__ import annotations

from enum import Enum


class FlagValue(str, Enum):
    """A flag's values as a `str` enum that prints and formats as its value ("da", not "Mode.DA"), so
    configs stay JSON-serialisable, hash the same, and messages read as the flag was written."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Mode(FlagValue):
    NONE = "none"      # host ranks do everything; DPU ranks check in and sleep
    NAIVE = "naive"    # DPU ranks train as extra replicas with a smaller batch
    DA = "da"          # DPU ranks load + augment the host ranks' batches
    MV = "mv"          # DPU ranks validate epoch i while the host ranks train epoch i+1
    HYBRID = "hybrid"  # some DPU ranks augment, the others validate
    AUTO = "auto"      # profile a few steps, predict every mode, run the fastest

    @property
    def augments_on_dpu(self) -> bool:
        """Host ranks receive their batches from a DPU augmentation rank."""
        return self in (Mode.DA, Mode.HYBRID)

    @property
    def validates_on_dpu(self) -> bool:
        """DPU ranks validate (all or part of) the validation set."""
        return self in (Mode.MV, Mode.HYBRID)

    @property
    def dpu_trains(self) -> bool:
        """DPU ranks are training replicas (one gradient group over the whole job)."""
        return self is Mode.NAIVE

    @property
    def offloads(self) -> bool:
        """The mode gives DPU ranks work (so it needs at least one)."""
        return self not in (Mode.NONE, Mode.AUTO)

    @property
    def resolved(self) -> bool:
        """A concrete mode (not `auto`, which resolves to one of the others at start-up)."""
        return self is not Mode.AUTO

    @property
    def keeps_math(self) -> bool:
        """Trains the same model as `none` (same batches, same steps); naive changes both."""
        return self is not Mode.NAIVE


# The concrete modes, in the order ties are broken (simpler first) by `--mode auto`.
CONCRETE: tuple[Mode, ...] = (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID, Mode.NAIVE)


class Numerics(FlagValue):
    """`--numerics`: what a difference between DPU-built and host-built samples does."""

    STRICT = "strict"  # stop before training
    WARN = "warn"      # say so (one line per host rank, and <log-dir>/numerics-rank<N>.jsonl), train on
    OFF = "off"        # no check

    @property
    def checks(self) -> bool:
        return self is not Numerics.OFF

    @property
    def stops(self) -> bool:
        return self is Numerics.STRICT


class Wire(FlagValue):
    """`--wire`: what DPU ranks send their host ranks."""

    AUTO = "auto"    # uint8 where the transform ends in deterministic float steps, else float
    UINT8 = "uint8"  # uint8 or an error saying why not
    FLOAT = "float"  # the transform's output as it is (float32 for most pipelines)


class StateCopy(FlagValue):
    """`--ckpt-copy`: how a host rank's slice leaves the training state's own memory."""

    STAGED = "staged"    # copied into a send buffer before the host goes on (blocks for the copy)
    OVERLAP = "overlap"  # copied in the background beside the next forward/backward (`host.capture`)
    ZERO = "zero"        # sent from the tensors' memory; the next optimizer step waits for the send

    @property
    def from_tensor_memory(self) -> bool:
        """Sent straight from the weights (CPU memory only, and the next step waits for the send)."""
        return self is StateCopy.ZERO

    @property
    def in_background(self) -> bool:
        return self is StateCopy.OVERLAP


class AllReduce(FlagValue):
    """`--allreduce`: how the host ranks sum their gradients (`common.train.allreduce`)."""

    AUTO = "auto"        # Horovod when it imports and matches this job's MPI, else torch (mpi under --recovery)
    HOROVOD = "horovod"  # Horovod's grouped allreduce
    TORCH = "torch"      # torch.distributed (NCCL on GPUs, gloo on CPUs)
    MPI = "mpi"          # one MPI allreduce through host memory (the one that can shrink its group)

    @property
    def shrinks(self) -> bool:
        """Can go on in a smaller group after a host rank's death (Horovod and torch.distributed cannot;
        auto resolves to mpi under --recovery)."""
        return self not in (AllReduce.HOROVOD, AllReduce.TORCH)


class Device(FlagValue):
    """`--device`: where the host ranks train (`common.train.device.resolve_device`)."""

    AUTO = "auto"  # this host rank's GPU when torch sees one, else the CPU
    CPU = "cpu"
    CUDA = "cuda"  # one GPU per host rank, by its rank on its node


class Amp(FlagValue):
    """`--amp`: the dtype the forward pass autocasts to."""

    OFF = "off"
    BF16 = "bf16"
    FP16 = "fp16"  # with loss scaling (`common.train.device.Compute.scales_loss`)


class LrSchedule(FlagValue):
    """`--lr-schedule`: the per-step multiplier of the peak learning rate (`common.train.training_state`)."""

    COSINE = "cosine"      # half a cosine from 1 to 0 over the run
    STEP = "step"          # 1, then 0.1 from half the run, 0.01 from three quarters
    CONSTANT = "constant"  # 1 throughout


class CkptErrors(FlagValue):
    """`--ckpt-errors`: what a checkpoint that cannot be written does to the run."""

    CONTINUE = "continue"  # train on, try again at the next one, exit non-zero at the end
    FAIL = "fail"          # stop the job at the first failure

    @property
    def stops_job(self) -> bool:
        return self is CkptErrors.FAIL

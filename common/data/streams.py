"""The loader stream protocol behind the public API's `job.loader` (`--mode da`), defined once.

A host rank's loader is one ordered stream of batch messages from its feeder DPU rank:

    host -> DPU, Tag.LOADER, pickled (`encode`/`decode`):
        OpenLoader(loader, dataset, sampling)  once per loader: the DPU rank builds the host's own
                                               `RankLoader` (same sampler, per-sample seeds, collate)
                                               and, with `check` > 0, answers with a `Fingerprint`
        NumericsQuery(loader, index, step)     after a fingerprint that differs from the host's: the
                                               DPU rank answers with that step's output (an array)
        Plan(loader, seq, epoch, start, end)   produce batches from (epoch, start) on, epoch after
                                               epoch, until the next plan or epoch `end` (the
                                               loader's `epochs`, if known); epoch STOP: nothing
    DPU -> host, Tag.NUMERICS, pickled: the answers above (`common.data.numerics`: the contract that
        the samples a DPU rank builds equal the host's own, checked before the first plan)
    DPU -> host, tag `stream_tag(loader)`, raw `common.data.batches` messages:
        MARKER(seq)                            everything before it belongs to older plans (the
                                               stream's first one is padded to a full batch: the
                                               DPU rank's progress probe, `dpu.serve.SendRing`)
        BATCH(epoch, step) ...                 in order, at most `--da-buffers` in flight
    Every DPU -> host message's `flags` say whether the host must poll often for the stream's large
    messages to move (FLAG_POLL: another machine, or shared memory without single-copy).

Why plans instead of one request per epoch: the DPU rank runs on into the next epoch while the
host still trains on this one (per-sample seeds make batch i of epoch e+1 computable at any time),
so an epoch edge costs the host no pipeline drain, unlike a DataLoader's. A loop that jumps (a
resumed epoch, an early `break`, the last epoch) sends a new plan and discards the batches of the
old one up to the marker: at most the ring's few batches are wasted, and MPI's non-overtaking order
on one (source, tag) is all the synchronisation needed.

Pickled messages carry the user's data set object. On the DPU rank, classes defined in the user's
script (`__main__.MyDataset` on the host) are found by importing the script as `__mp_main__`,
without running its `if __name__ == "__main__":` block: the rule multiprocessing's spawn start
method (and so every DataLoader with workers on macOS) already imposes.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import runpy
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.messages import Tag

STOP = -1                 # Plan.epoch: stop producing (the loader is closed or the job ends)
SCRIPT_MODULE = "__mp_main__"


@dataclass(frozen=True)
class Recipe:
    """A data set the DPU rank builds itself, `build()`, instead of receiving it pickled."""

    build: Callable[[], Any]


@dataclass(frozen=True)
class OpenLoader:
    loader: int           # the loader's number on its host rank (0, 1, ... in creation order)
    dataset: Any          # the user's map-style data set, unwrapped (the DPU rank seeds it itself), or a Recipe
    sampling: Sampling
    host_share: float = 0.0   # --da-host-share: the steps the host builds itself (`StepSplit`); the DPU the rest
    check: int = 0            # --numerics: fingerprint this many samples for the host before any plan (0: none)
    host_steps: int = 0       # --wire uint8: the transform's last steps the host runs on batches (`common.data.wire`)

    def wire_view(self, dataset: Any) -> Any:
        """The data set as this loader's DPU rank builds it: without the host's last steps, in uint8."""
        if not self.host_steps:
            return dataset
        from dpuoffload.common.data.numerics import transform_steps
        from dpuoffload.common.data.wire import Split, dpu_view

        return dpu_view(dataset, Split(tuple(transform_steps(dataset)), self.host_steps))

    def materialize(self) -> Any:
        """The data set on the DPU rank: as received, or built from its recipe."""
        return self.dataset.build() if isinstance(self.dataset, Recipe) else self.dataset


@dataclass(frozen=True)
class Plan:
    loader: int
    seq: int              # 1, 2, ... per loader; the MARKER that starts this plan's batches repeats it
    epoch: int            # first epoch to produce, or STOP
    start: int = 0        # first step of that epoch
    end: int = STOP       # produce no batch of this epoch or later (STOP: no bound, run on)


@dataclass(frozen=True)
class NumericsQuery:
    """The host asks for one step's output of one sample (`common.data.numerics.step_output`):
    the first place where the DPU rank's fingerprint parted from the host's."""

    loader: int
    index: int
    step: Optional[int]   # None: the sample's image as `__getitem__` returns it


@dataclass(frozen=True)
class ValidatorSetup:
    """`job.validate`'s first call (`--mode mv`/`hybrid`): what the DPU validation ranks evaluate.
    The model's weights are replaced every epoch by the state slices of the host ranks."""

    model: Any
    val_set: Any
    batch_size: int


Message = Union[OpenLoader, Plan, NumericsQuery, ValidatorSetup]


@dataclass(frozen=True)
class StepSplit:
    """Which steps of every epoch the host rank builds itself (`--da-host-share f`) and which its
    DPU rank sends: step s is the host's when floor((s + 1) f) > floor(s f), so the host's steps are
    spread evenly (f = 0.25: steps 3, 7, 11, ...) and step 0 is the DPU rank's (f < 1). Both sides
    compute it from the same f; plans and batch headers name steps of the whole epoch."""

    share: float
    steps: int

    def host(self, step: int) -> bool:
        return math.floor((step + 1) * self.share) > math.floor(step * self.share)

    def owned(self, host: bool) -> int:
        """How many steps of an epoch one side builds."""
        return sum(self.host(s) == host for s in range(self.steps))

    def next_of(self, host: bool, epoch: int, step: int) -> tuple[int, int]:
        """The first (epoch, step) at or after (epoch, step) that side builds (it must build some)."""
        while True:
            if step >= self.steps:
                epoch, step = epoch + 1, 0
            if self.host(step) == host:
                return epoch, step
            step += 1


def stream_tag(loader: int) -> int:
    """The MPI tag of loader `loader`'s batches (one ordered stream per host rank and loader)."""
    return int(Tag.STREAM_BASE) + loader


def encode(message: Message) -> bytes:
    """Pickle a message on the host rank, with an error that names what cannot be sent and the fix."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        if isinstance(message, ValidatorSetup):
            raise ConfigError(f"job.validate cannot send the model ({type(message.model).__name__}) and the validation "
                              f"set ({type(message.val_set).__name__}) to the DPU validation ranks: {e}. Both must "
                              "pickle: module-level classes and functions, no lambdas (pass the bare model, not a "
                              "DDP wrapper)") from None
        what = type(message.dataset).__name__ if isinstance(message, OpenLoader) else "the message"
        if isinstance(message, OpenLoader) and isinstance(message.dataset, Recipe):
            raise ConfigError(f"job.loader cannot send build_on_dpu={message.dataset.build!r} to its DPU rank: "
                              f"{e}. Pass a module-level function (or a functools.partial of one)") from None
        raise ConfigError(f"job.loader cannot send the data set ({what}) to its DPU rank: {e}. The data set "
                          "and its transforms must pickle, as for a DataLoader with workers under the spawn start "
                          "method: use module-level functions or classes instead of lambdas and local "
                          "functions") from None


def decode(data: bytes, script: Optional[str]) -> Message:
    """Unpickle a message on the DPU rank; `script` is the user's training script: its classes
    (`__main__.X`) and the modules next to it import as they do on the host."""
    if script is not None:
        _add_script_folder(script)
    return _ScriptUnpickler(io.BytesIO(data), script).load()


def _add_script_folder(script: str) -> None:
    folder = os.path.dirname(os.path.abspath(script))
    if folder not in sys.path:
        sys.path.insert(0, folder)


class _ScriptUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, script: Optional[str]) -> None:
        super().__init__(file)
        self.script = script

    def find_class(self, module: str, name: str) -> Any:
        if module == "__main__" and self.script is not None:
            main = import_script(self.script)
            if not hasattr(main, name):
                raise ConfigError(f"the DPU rank cannot find {name} in {self.script}: define it at module level "
                                  "(outside `if __name__ == \"__main__\":`)")
            return getattr(main, name)
        return super().find_class(module, name)


def import_script(script: str) -> types.ModuleType:
    """The user's script as module `__mp_main__` (once), its folder on sys.path as `python script.py` has it."""
    loaded = sys.modules.get(SCRIPT_MODULE)
    if loaded is not None and getattr(loaded, "__file__", None) == os.path.abspath(script):
        return loaded
    _add_script_folder(script)
    module = types.ModuleType(SCRIPT_MODULE)
    module.__file__ = os.path.abspath(script)
    sys.modules[SCRIPT_MODULE] = module
    try:
        module.__dict__.update(runpy.run_path(script, run_name=SCRIPT_MODULE))
    except BaseException:
        del sys.modules[SCRIPT_MODULE]
        raise
    return module

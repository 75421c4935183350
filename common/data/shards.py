"""Sharded and streaming data sets: a stream of shards, walked as the batches the host would build.

A map-style data set has an index, so "the batches the host rank would build" is its
`DistributedSampler` order. A stream (WebDataset tar shards, a Hugging Face streaming data set, a
user's own `IterableDataset`) has none; this module gives it one, and the rest of the data path
(per-sample seeds, the uint8 wire, the numerics check, `--dpu-workers`, `--da-host-share`, lossy
forward, resume) then works on streams unchanged.

The contract (docs/batches.md, "Streams"):

- **Sample ids.** Shards are numbered in the stream's own order, samples within a shard by their
  offset; sample (shard s, offset o) has the global id `sum(sizes[:s]) + o`. Sizes are counted once,
  when the data set is wrapped (tar headers only, no decoding), and travel with it to the DPU rank.
- **Shards over host ranks.** Every epoch the shards are put in a seeded order (seed, epoch) and
  handed out greedily to the host rank with the fewest samples so far (ties: the lowest rank), as
  webdataset's `split_by_node` does but balanced for uneven shards. A host rank's samples are its
  shards' records in that order, through a bounded shuffle buffer (`buffered_shuffle`, seeded by
  seed, epoch, rank): the buffer holds records, never all of them, and emits from its 100th on.
- **Equal epochs.** Every host rank trains `ceil(total / host ranks)` samples per epoch, as
  `DistributedSampler` pads: a rank whose shards hold fewer repeats its first ones, a rank whose
  shards hold more leaves its last ones for that epoch. `ShardPlan.balance` counts both; the epoch
  record says them.
- **Augmentation.** Each sample is built under its own seeds from (seed, epoch, global id), the
  same per-sample seeding as map-style sets (`common.data.sampling`).

What a host rank receives depends on the data set, the seed, the epoch and the host rank count
only: DPU ranks, DPU workers and the host's own share split *steps*, never shards, so none of them
changes a batch. The process that builds a batch reads its records from the shards in the order
above (`ShardReader`), keeping the records it passed over for the steps that need them next.

A stream must provide (`ShardSource`): `shards` (the shard names, in a fixed order), `open_shard(
name)` (the shard's records, in order, cheap to hold: bytes, a path, a row) and `sample(record)`
(decode and augment one record; random draws allowed, they run under the sample's seeds). The
records must come out the same every time a shard is opened. `shard_length(name)` is optional
(otherwise each shard is iterated once to count it). A source whose records are finished samples,
augmented as they are read (a user's webdataset pipeline, `tarshards.PipelineShards`), says
`seeded_records = True`: the reader then builds each record under that sample's seeds.
"""

from __future__ import annotations

import bisect
import collections
import copy
import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, Sequence, TypeVar, cast

from torch.utils.data import Dataset

from dpuoffload.common.data.sampling import reseed, sample_seed
from dpuoffload.common.errors import ConfigError, SampleError

SHUFFLE_BUFFER = 1000          # records in a host rank's shuffle buffer (webdataset's usual size)
OPEN_CURSORS = 8               # shards a reader keeps open at once
REQUIRED = ("shards", "open_shard", "sample")
_ORDER_SALT = 1 << 40          # keeps the shard order's seed apart from the buffers' and the samples'
_BUFFER_SALT = 1 << 41

T = TypeVar("T")
_Record = TypeVar("_Record")   # a stream's own record type: what `open_shard` yields is what `sample` takes


class ShardSource(Protocol[_Record]):
    """What a stream provides to be trained from (duck-typed; `missing_members` names what lacks).
    `_Record` is the stream's own record type (bytes, a path, a row); a sample is anything the
    batches' collation takes, typically (image tensor, label)."""

    @property
    def shards(self) -> Sequence[str]:
        """The shard names, in a fixed order (read only: a list attribute provides it)."""

    def open_shard(self, shard: str, /) -> Iterable[_Record]:
        """The shard's records, in order, the same every time (no randomness here)."""

    def sample(self, record: _Record, /) -> object:
        """One record made into a training sample: typically (transform(decode(image)), label)."""


class ShardError(ConfigError):
    """A shard that cannot be read, or reads differently from when it was counted."""


def missing_members(source: object) -> list[str]:
    """The members of `ShardSource` that `source` lacks (empty: it is a stream we can train from)."""
    return [m for m in REQUIRED if not hasattr(source, m)]


def refusal(source: object, where: str) -> ConfigError:
    """The one line for a stream without the shard protocol."""
    lacking = ", ".join(missing_members(source))
    return ConfigError(f"{where} takes a map-style data set (with __getitem__ and __len__) or a stream of shards; "
                       f"{type(source).__name__} is a stream without the shard protocol (missing: {lacking}): "
                       "a stream must name its shards (`shards`: a list of names), open one (`open_shard(name)`: its "
                       "records in order) and make a record a sample (`sample(record)`); or use "
                       "dpuoffload.webdataset(pattern) for tar shards, dpuoffload.huggingface(ds) for Hugging Face "
                       "data sets (docs/batches.md, \"Streams\")")


# ------------------------------------------------------------------------------------- the plan
def _rng(seed: int, epoch: int, salt: int) -> random.Random:
    return random.Random(sample_seed(seed, epoch, salt))


def buffered_shuffle(items: Iterable[T], size: int, rng: random.Random, initial: int = 100) -> Iterator[T]:
    """webdataset's shuffle (`webdataset.filters._shuffle`): a buffer of at most `size` items, filled
    two items per item emitted, emitting a random one from `initial` items on (so the first batch
    does not wait for a full buffer); the rest in random order at the end."""
    it = iter(items)
    initial = min(initial, size)
    buf: list[T] = []
    for item in it:
        buf.append(item)
        if len(buf) < size:
            for more in itertools.islice(it, 1):
                buf.append(more)
        if len(buf) >= initial:
            yield _pick(buf, rng)
    while buf:
        yield _pick(buf, rng)


def _pick(buf: list[T], rng: random.Random) -> T:
    k = rng.randrange(len(buf))
    buf[k], buf[-1] = buf[-1], buf[k]
    return buf.pop()


@dataclass(frozen=True)
class ShardPlan:
    """Which samples each host rank trains in an epoch, and in which order (pure, the same on every rank)."""

    sizes: tuple[int, ...]     # samples per shard, in the stream's shard order
    replicas: int              # host ranks
    seed: int
    shuffle: bool = True
    buffer: int = SHUFFLE_BUFFER

    def __post_init__(self) -> None:
        if len(self.sizes) < self.replicas:
            raise ConfigError(f"a stream of {len(self.sizes)} shard(s) cannot feed {self.replicas} host ranks: each "
                              "host rank reads whole shards; write the data as at least as many shards as host "
                              "ranks (more and smaller shards also balance better)")
        if self.buffer < 1:
            raise ConfigError(f"shuffle_buffer must be >= 1, got {self.buffer}")

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def per_rank(self) -> int:
        """Samples every host rank trains per epoch (`DistributedSampler`'s ceil(n / replicas))."""
        return -(-self.total // self.replicas)

    @property
    def starts(self) -> tuple[int, ...]:
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return tuple(out)

    def shard_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.sizes)))
        if self.shuffle:
            _rng(self.seed, epoch, _ORDER_SALT).shuffle(order)
        return order

    def assignment(self, epoch: int) -> list[list[int]]:
        """Each host rank's shards in reading order: greedily to the least-loaded rank (ties: lowest)."""
        load = [0] * self.replicas
        out: list[list[int]] = [[] for _ in range(self.replicas)]
        for shard in self.shard_order(epoch):
            r = min(range(self.replicas), key=lambda k: (load[k], k))
            out[r].append(shard)
            load[r] += self.sizes[shard]
        return out

    def stream(self, epoch: int, rank: int) -> list[int]:
        """Host rank `rank`'s sample ids in the order its shuffle buffer emits them (all of them)."""
        starts = self.starts
        ids = (starts[s] + o for s in self.assignment(epoch)[rank] for o in range(self.sizes[s]))
        if not self.shuffle:
            return list(ids)
        return list(buffered_shuffle(ids, self.buffer, _rng(self.seed, epoch, _BUFFER_SALT + rank)))

    def order(self, epoch: int, rank: int) -> list[int]:
        """The ids host rank `rank` trains in `epoch`: its stream cut or padded (from its start) to `per_rank`."""
        ids = self.stream(epoch, rank)
        want = self.per_rank
        if not ids:
            raise ConfigError(f"host rank {rank} got no samples in epoch {epoch}: its shards are empty")
        while len(ids) < want:
            ids += ids[:want - len(ids)]
        return ids[:want]

    def balance(self, epoch: int) -> dict[str, int]:
        """Samples the epoch repeats (padded) and leaves out (dropped), over all host ranks."""
        loads = [sum(self.sizes[s] for s in shards) for shards in self.assignment(epoch)]
        want = self.per_rank
        return {"padded": sum(max(0, want - n) for n in loads), "dropped": sum(max(0, n - want) for n in loads)}


# ---------------------------------------------------------------------------------- the data set
class ShardedSet(Dataset[object]):
    """A stream seen as a map-style data set over global sample ids (`__getitem__(id)`), read in
    shard order by a `ShardReader`. The loaders walk it in `ShardPlan` order (`plan`), never in index
    order. Its `transform` is the source's (what the uint8 wire splits and the numerics check traces).
    """

    def __init__(self, source: ShardSource[_Record], shuffle_buffer: int = SHUFFLE_BUFFER,
                 sizes: Optional[Sequence[int]] = None, name: Optional[str] = None) -> None:
        if missing_members(source):
            raise refusal(source, "job.loader")
        # (the record type is the source's own: records go only from its `open_shard` to its `sample`,
        # so the set holds it as a source of `object` records)
        self.source = cast("ShardSource[object]", source)
        self.shards: tuple[str, ...] = tuple(str(s) for s in source.shards)
        if not self.shards:
            raise ConfigError(f"{name or type(source).__name__}: the stream names no shards")
        self.shuffle_buffer = int(shuffle_buffer)
        self.name = name or type(source).__name__
        self.sizes = tuple(int(n) for n in sizes) if sizes is not None else self._count()
        self.starts = ShardPlan(self.sizes, 1, 0).starts
        self._reader: Optional[ShardReader] = None
        self.seeded_reads = bool(getattr(source, "seeded_records", False))  # records built (augmented) as read
        self.seeds = (0, 0)   # (seed, epoch) a seeded read builds its record under (`bind_sample_seeds`)
        if len(self) == 0:
            raise ConfigError(f"{self.name}: its {len(self.shards)} shard(s) hold no samples")

    # (the transform lives on the source: `sample` applies it; views of this set get their own source)
    @property
    def transform(self) -> object:
        """The source's `transform` (typically a torchvision Compose), None when it has none."""
        return getattr(self.source, "transform", None)

    @transform.setter
    def transform(self, value: object) -> None:
        setattr(self.source, "transform", value)  # (an attribute of the source, not of `ShardSource`)

    def __copy__(self) -> "ShardedSet":
        """A view with its own source (the uint8 wire and the numerics check swap its transform) and
        its own reader."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.source = copy.copy(self.source)
        out._reader = None
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_reader"] = None   # (open files stay in the process that opened them)
        return state

    def __len__(self) -> int:
        return self.starts[-1] + self.sizes[-1]

    def bind_sample_seeds(self, seed: int, epoch: int) -> None:
        """(`PerSampleSeeded`) The seeds a source whose records are built as they are read (a user's
        pipeline) builds record `id` under: sample_seed(seed, epoch, id), whichever request read it.
        Records read ahead in another epoch are dropped."""
        if self.seeded_reads and self.seeds != (seed, epoch):
            self._reader = None
        self.seeds = (seed, epoch)

    def head(self, n: int) -> "ShardedSet":
        """The first `n` samples in shard order (`--train-subset` on a stream): the shards that hold
        them, the last one read only so far. Every rank cuts the same."""
        if n >= len(self):
            return self
        sizes: list[int] = []
        for size in self.sizes:
            take = min(size, n - sum(sizes))
            if take <= 0:
                break
            sizes.append(take)
        out = copy.copy(self)
        out.shards, out.sizes = self.shards[:len(sizes)], tuple(sizes)
        out.starts = ShardPlan(out.sizes, 1, 0).starts
        return out

    def plan(self, replicas: int, seed: int, shuffle: bool = True) -> ShardPlan:
        return ShardPlan(self.sizes, replicas, seed, shuffle, self.shuffle_buffer)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, offset) of sample `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of a stream of {len(self)}")
        s = bisect.bisect_right(self.starts, index) - 1
        return s, index - self.starts[s]

    def where(self, index: int) -> str:
        """Sample `index` in words, for errors: its shard and offset."""
        s, o = self.locate(index)
        return f"sample {index} (record {o} of shard {self.shards[s]})"

    @property
    def reader(self) -> "ShardReader":
        if self._reader is None:
            self._reader = ShardReader(self, keep=2 * self.shuffle_buffer + 256)
        return self._reader

    def __getitem__(self, index: int) -> object:
        record = self.reader.get(int(index))
        try:
            return self.source.sample(record)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's decode/augment: say which record
            raise SampleError(f"{self.name}: {self.where(int(index))} could not be built: "
                              f"{type(e).__name__}: {e}") from e

    def _count(self) -> tuple[int, ...]:
        sizes = []
        length: Optional[Callable[[str], int]] = getattr(self.source, "shard_length", None)
        for shard in self.shards:
            try:
                n = length(shard) if length is not None else sum(1 for _ in self.source.open_shard(shard))
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001 - a missing or unreadable shard, named
                raise ShardError(f"{self.name}: shard {shard} cannot be read: {type(e).__name__}: {e}") from None
            sizes.append(int(n))
        return tuple(sizes)


class _Cursor:
    def __init__(self, it: Iterator[object]) -> None:
        self.it, self.offset = it, 0


class ShardReader:
    """Records by global id, read forward through each shard: a record passed over on the way to
    another is kept (at most `keep` of them, oldest dropped first) for the request that comes for it
    soon (the shuffle buffer emits within a window of its size). A request behind a shard's cursor
    that was not kept reopens the shard (a resumed epoch's first steps, padding at an epoch's end).
    Counts shards opened and records read, for the benchmarks."""

    def __init__(self, data: ShardedSet, keep: int) -> None:
        self.data, self.keep = data, keep
        self.kept: collections.OrderedDict[int, object] = collections.OrderedDict()
        self.cursors: collections.OrderedDict[int, _Cursor] = collections.OrderedDict()
        self.opened = 0
        self.read = 0

    def get(self, index: int) -> object:
        if index in self.kept:
            return self.kept.pop(index)
        shard, offset = self.data.locate(index)
        cursor = self.cursors.pop(shard, None)
        if cursor is None or cursor.offset > offset:
            cursor = self._open(shard)
        start = self.data.starts[shard]
        while cursor.offset < offset:
            self._keep(start + cursor.offset, self._next(shard, cursor))
        record = self._next(shard, cursor)
        if cursor.offset < self.data.sizes[shard]:
            self.cursors[shard] = cursor  # (most recently used last)
            while len(self.cursors) > OPEN_CURSORS:
                self.cursors.popitem(last=False)
        return record

    def _open(self, shard: int) -> _Cursor:
        name = self.data.shards[shard]
        try:
            it = iter(self.data.source.open_shard(name))
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001
            raise ShardError(f"{self.data.name}: shard {name} cannot be opened: {type(e).__name__}: {e}") from None
        self.opened += 1
        return _Cursor(it)

    def _next(self, shard: int, cursor: _Cursor) -> object:
        name = self.data.shards[shard]
        if self.data.seeded_reads:  # (the pipeline augments as it reads: under this record's own seeds)
            reseed(sample_seed(*self.data.seeds, self.data.starts[shard] + cursor.offset))
        try:
            record = next(cursor.it)
        except StopIteration:
            hint = getattr(self.data.source, "short_hint", "")
            raise ShardError(f"{self.data.name}: shard {name} ended after {cursor.offset} record(s), but held "
                             f"{self.data.sizes[shard]} when counted: shards must not change during a run"
                             f"{hint}") from None
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - a truncated or corrupt shard, named
            raise ShardError(f"{self.data.name}: shard {name}, record {cursor.offset}: "
                             f"{type(e).__name__}: {e}") from None
        cursor.offset += 1
        self.read += 1
        return record

    def _keep(self, index: int, record: object) -> None:
        self.kept[index] = record
        while len(self.kept) > self.keep:
            self.kept.popitem(last=False)


def sharded_of(dataset: Any) -> Optional[ShardedSet]:
    """The `ShardedSet` under `dataset`'s wrappers (per-sample seeding, the wire's views), or None."""
    seen = 0
    while dataset is not None and seen < 8:
        if isinstance(dataset, ShardedSet):
            return dataset
        if type(dataset).__name__ == "Subset" and isinstance(getattr(dataset, "dataset", None), ShardedSet):
            raise ConfigError("a subset of a stream cannot be walked in shard order: pass the stream itself (write "
                              "a smaller set of shards for a smaller run, instead of --train-subset)")
        dataset = getattr(dataset, "dataset", None)
        seen += 1
    return None


def as_stream(dataset: Any, where: str = "job.loader") -> Any:
    """`dataset` as `job.loader` takes it: a map-style set as it is, a stream with the shard protocol
    wrapped in a `ShardedSet`, any other stream refused with the line that says what it lacks."""
    if isinstance(dataset, ShardedSet):
        return dataset
    if not missing_members(dataset):
        return ShardedSet(dataset)
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return dataset
    if hasattr(dataset, "__iter__"):
        raise refusal(dataset, where)
    return dataset

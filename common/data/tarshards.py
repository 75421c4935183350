"""WebDataset tar shards: `--dataset webdataset:PATTERN` and `dpuoffload.webdataset(pattern, transform)`.

A WebDataset shard is a plain tar file whose members are grouped into samples by key (the member
name up to its first dot: `000123.jpg` and `000123.cls` are one sample, `{"jpg": ..., "cls": ...}`).
This module reads them with the standard library's `tarfile`, so the DPU program needs no extra
package: records are the raw member bytes (what the shuffle buffer holds), and `TarShards.sample`
decodes the image (PIL) and applies the transform under the sample's seeds, as ImageFolder does.
Shard names are paths or brace patterns (`train-{000000..000146}.tar`, webdataset's own syntax via
`braceexpand`); `pipe:CMD` names (a command that writes the shard to stdout) go through
webdataset's `gopen` where webdataset is installed. Remote object stores are not tested here (no
network); `pipe:` names are, with a local `cat`.

`TarIndexed` is the map-style twin for validation sets: an index of member offsets built by one
pass over the headers, then each sample read by offset (as webdataset's `wids` does).
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar, Union, cast

from dpuoffload.common.data.shards import SHUFFLE_BUFFER, ShardedSet
from dpuoffload.common.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp")
LABEL_KEYS = ("cls", "label", "class")
Record = dict[str, Union[str, bytes]]   # a tar record: each member's bytes by extension, and `__key__` (str)
_Image = TypeVar("_Image")               # what a decode makes of a record's image (a PIL image by default)


def expand(pattern: Union[str, Sequence[str]]) -> list[str]:
    """Shard names from a brace pattern (or a list of patterns), in order; local files must exist."""
    from braceexpand import braceexpand

    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    names = [name for p in patterns for name in braceexpand(p)]
    if not names:
        raise ConfigError(f"webdataset: {pattern!r} names no shards")
    missing = [n for n in names if _is_local(n) and not os.path.isfile(n)]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ConfigError(f"webdataset: shard {missing[0]} does not exist{more} (pattern {pattern!r}); check the "
                          "path and the brace range, or write the shards (dpurun make-data writes the bundled set "
                          "as tinyimagenet/shards/)")
    return names


def _is_local(name: str) -> bool:
    return not (name.startswith("pipe:") or "://" in name)


def _open(name: str) -> IO[bytes]:
    if _is_local(name):
        return open(name, "rb")
    try:
        from webdataset.gopen import gopen
    except ImportError:
        raise ConfigError(f"webdataset: shard {name} is not a local file; reading it needs the webdataset package "
                          "(pip install webdataset)") from None
    return gopen(name, "rb")


def _key_ext(member: str) -> tuple[str, str]:
    """webdataset's split of a member name: key = path up to the first dot of the base name."""
    folder, base = os.path.split(member)
    stem, dot, ext = base.partition(".")
    return os.path.join(folder, stem) if folder else stem, ext.lower() if dot else ""


def iter_records(name: str) -> Iterator[Record]:
    """The shard's samples, in order: member bytes by extension, plus `__key__`.

    Raises:
        tarfile.ReadError: a member or the archive cut short (a truncated shard), or a damaged header.
    """
    with _open(name) as f:
        current: Optional[Record] = None
        for member, data in _members(f, with_data=True):
            key, ext = _key_ext(member)
            if current is not None and current["__key__"] != key:
                yield current
                current = None
            if current is None:
                current = {"__key__": key}
            current[ext] = data
        if current is not None:
            yield current


def count_records(name: str) -> int:
    """Samples in a shard from its headers alone (member data is skipped, not read).

    Raises:
        tarfile.ReadError: as `iter_records`.
    """
    keys, last = 0, None
    with _open(name) as f:
        for member, _ in _members(f, with_data=False):
            key = _key_ext(member)[0]
            keys += key != last
            last = key
    return keys


# -------------------------------------------------------------------------------- the tar format
BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
FILE_TYPES = (b"0", b"\0", b"7")   # regular (and contiguous) files; directories, links and the like are skipped


def _members(f: IO[bytes], with_data: bool) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every regular file of a tar stream, in order (bytes empty without `with_data`).

    A plain reader of ustar, GNU long-name and pax-path headers, instead of `tarfile`'s stream mode:
    that costs about 50 us of Python per member (its `TarInfo` machinery), as much as decoding a
    small JPEG, and it ends a truncated archive quietly where this raises."""
    long_name: Optional[str] = None
    while True:
        header = _read(f, BLOCK, "a member header")
        if header == ZERO_BLOCK:
            return
        _check_sum(header)
        size, kind = _number(header[124:136]), header[156:157]
        name, long_name = long_name or _name(header), None
        padded = size + (-size) % BLOCK
        if kind in FILE_TYPES and not with_data:
            _skip(f, padded, name)
            yield name, b""
        elif kind in FILE_TYPES:
            yield name, _read(f, padded, f"member {name}")[:size]
        elif kind == b"L":      # GNU: the next member's long name
            long_name = _read(f, padded, "a long name")[:size].rstrip(b"\0").decode("utf-8", "replace")
        elif kind == b"x":      # pax: the next member's attributes, its path among them
            long_name = _pax_path(_read(f, padded, "pax attributes")[:size])
        else:
            _skip(f, padded, name)


def _read(f: IO[bytes], n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise tarfile.ReadError(f"unexpected end of data in {what} (truncated shard?)")
    return data


def _skip(f: IO[bytes], n: int, name: str) -> None:
    """Past `n` bytes of member `name`: seeked over in a file (a seek past the end shows as the next
    header's short read), read through in a pipe."""
    if n and getattr(f, "seekable", lambda: False)():
        f.seek(n, os.SEEK_CUR)
        return
    while n:
        n -= len(_read(f, min(n, 1 << 20), f"member {name}"))


def _check_sum(header: bytes) -> None:
    """The header's checksum: its bytes summed with the checksum field read as spaces."""
    stored = header[148:156].split(b"\0", 1)[0].strip()
    if not stored or int(stored, 8) != sum(header) - sum(header[148:156]) + 8 * 32:
        raise tarfile.ReadError("a member header with a bad checksum (a corrupt shard, or not a tar file)")


def _number(field: bytes) -> int:
    """An octal number field, or GNU's base-256 form (first byte's high bit set)."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        name = prefix + b"/" + name if prefix else name
    return name.decode("utf-8", "replace")


def _pax_path(records: bytes) -> Optional[str]:
    """`path=` of pax extended attributes ("%d path=%s\n" records)."""
    at = 0
    while at < len(records):
        length_field, _, rest = records[at:].partition(b" ")
        length = int(length_field)
        key, _, value = rest[:length - len(length_field) - 2].partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "replace")
        at += length
    return None


@dataclass
class Decode:
    """A record made into (image, label): the first image member found, PIL RGB; the label member as an int."""

    image: tuple[str, ...] = IMAGE_KEYS
    label: tuple[str, ...] = LABEL_KEYS

    def __call__(self, record: Record) -> tuple["Image.Image", int]:
        from PIL import Image

        img_key = next((k for k in self.image if k in record), None)
        lab_key = next((k for k in self.label if k in record), None)
        if img_key is None or lab_key is None:
            wanted = self.image if img_key is None else self.label
            what = f"{'an image' if img_key is None else 'a label'} ({'/'.join(wanted)})"
            raise ConfigError(f"record {cast(Optional[str], record.get('__key__'))} has no {what} member; it has: "
                              f"{', '.join(k for k in record if k != '__key__')}")
        with Image.open(io.BytesIO(cast(bytes, record[img_key]))) as im:  # (members are bytes, only __key__ is not)
            image = im.convert("RGB")
        return image, int(cast(bytes, record[lab_key]).decode().strip())


class TarShards:
    """A `ShardSource` over WebDataset tar shards: records are member bytes, `sample` decodes and transforms."""

    def __init__(self, pattern: Union[str, Sequence[str]], transform: Optional[Callable[[Any], Any]] = None,
                 decode: Optional[Callable[[Record], tuple[Any, int]]] = None) -> None:
        self.pattern = pattern
        self.shards = expand(pattern)
        self.transform = transform
        self.decode = decode or Decode()

    def shard_length(self, shard: str) -> int:
        return count_records(shard)

    def open_shard(self, shard: str) -> Iterator[Record]:
        return iter_records(shard)

    def sample(self, record: Record) -> tuple[Any, int]:
        image, label = self.decode(record)
        return (self.transform(image) if self.transform is not None else image), label


class PipelineShards:
    """A `ShardSource` over a user's own webdataset pipeline, made per shard by `pipeline(name)`:
    its samples are the records, built (decoded, augmented) as they are read, each under its own
    seeds (`seeded_records`). The pipeline must give one sample per tar record, in order: no
    shuffle, select or batching stage (the stream's shard order and buffer are the loader's)."""

    seeded_records = True
    short_hint = ("; a pipeline must give one sample per record, and read its shard whole: make it with "
                  "wds.WebDataset(name, shardshuffle=False, nodesplitter=None, workersplitter=None) (webdataset "
                  "otherwise splits its shards over DataLoader workers) and no select or shuffle stage")

    def __init__(self, pattern: Union[str, Sequence[str]], pipeline: Callable[[str], Any]) -> None:
        self.shards = expand(pattern)
        self.pipeline = pipeline

    def shard_length(self, shard: str) -> int:
        return count_records(shard)

    def open_shard(self, shard: str) -> Iterator[Any]:
        return iter(self.pipeline(shard))

    def sample(self, record: Any) -> Any:
        return record


def webdataset(pattern: Union[str, Sequence[str]], transform: Optional[Callable[[_Image], object]] = None, *,
               decode: Optional[Callable[[Record], tuple[_Image, int]]] = None,
               pipeline: Optional[Callable[[str], Iterable[object]]] = None,
               shuffle_buffer: int = SHUFFLE_BUFFER) -> ShardedSet:
    """WebDataset tar shards as a training stream for `job.loader` (public API: `dpuoffload.webdataset`).

    Args:
        pattern: shard paths, a brace pattern (`"data/train-{000000..000146}.tar"`), a list of them,
            or `pipe:CMD` names (with webdataset installed).
        transform: applied to each decoded image (a PIL image with the default `decode`, else what
            `decode` makes) under the sample's seeds (a torchvision Compose: the uint8 wire splits
            it, the numerics check traces it).
        decode: record (member bytes by extension, and its `__key__` string) -> (image, label);
            default: the first image member (jpg, png, ...) as PIL RGB and the `cls` member as an int.
        pipeline: instead of `transform` and `decode`, your own webdataset pipeline for one shard,
            `pipeline(name)` -> an iterable of (sample, label), e.g. `wds.WebDataset(name,
            shardshuffle=False, nodesplitter=None, workersplitter=None).decode("pil").to_tuple("jpg",
            "cls").map_tuple(augment, int)`, from a module-level function (it is pickled to the DPU
            rank); one sample per tar record, in order, each built under its own seeds.
        shuffle_buffer: records in each host rank's shuffle buffer.

    Returns:
        A `ShardedSet`: its shards counted (headers only), walked in the stream order of docs/batches.md.
    """
    if pipeline is not None:
        if transform is not None or decode is not None:
            raise ConfigError("dpuoffload.webdataset: give either pipeline= or transform=/decode=, not both (a "
                              "pipeline decodes and augments itself)")
        source: Any = PipelineShards(pattern, pipeline)
    else:
        source = TarShards(pattern, transform, decode)
    return ShardedSet(source, shuffle_buffer, name=f"webdataset {_short(pattern)}")


def _short(pattern: Union[str, Sequence[str]]) -> str:
    return pattern if isinstance(pattern, str) else f"{pattern[0]} (+{len(pattern) - 1})"


class TarIndexed:
    """Tar shards as a map-style data set (validation): member offsets indexed once, samples read by offset."""

    def __init__(self, pattern: Union[str, Sequence[str]], transform: Optional[Callable[[Any], Any]] = None,
                 decode: Optional[Callable[[Record], tuple[Any, int]]] = None) -> None:
        self.shards = expand(pattern)
        self.transform = transform
        self.decode = decode or Decode()
        self.index: list[tuple[int, str, tuple[tuple[str, int, int], ...]]] = []  # (shard, key, (ext, at, size)...)
        for s, name in enumerate(self.shards):
            if not _is_local(name):
                raise ConfigError(f"webdataset: {name}: a validation set must be local files (read by offset)")
            self._index(s, name)

    def _index(self, s: int, name: str) -> None:
        try:
            with tarfile.open(name, mode="r:*") as tar:
                members: dict[str, list[tuple[str, int, int]]] = {}
                for m in tar.getmembers():
                    if m.isfile():
                        key, ext = _key_ext(m.name)
                        members.setdefault(key, []).append((ext, m.offset_data, m.size))
        except (tarfile.TarError, OSError) as e:
            raise ConfigError(f"webdataset: shard {name} cannot be read: {type(e).__name__}: {e}") from None
        self.index += [(s, key, tuple(parts)) for key, parts in members.items()]

    def __len__(self) -> int:
        return len(self.index)

    def record(self, i: int) -> Record:
        s, key, parts = self.index[i]
        out: Record = {"__key__": key}
        with open(self.shards[s], "rb") as f:
            for ext, at, size in parts:
                f.seek(at)
                out[ext] = f.read(size)
        return out

    def labels(self) -> list[int]:
        """Every sample's label (validation's class count, without decoding an image)."""
        keys = self.decode.label if isinstance(self.decode, Decode) else LABEL_KEYS
        out = []
        for i in range(len(self)):
            record = self.record(i)
            key = next((k for k in keys if k in record), None)
            if key is not None:
                out.append(int(cast(bytes, record[key]).decode().strip()))
        return out

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, label = self.decode(self.record(i))
        return (self.transform(image) if self.transform is not None else image), label

"""Hugging Face `datasets` for `job.loader` (public API: `dpuoffload.huggingface`).

Two kinds, one call:
- a map-style `datasets.Dataset` (Arrow files, e.g. `load_dataset(..., split="train")` or
  `load_from_disk`), with or without the user's `set_transform`: its rows are dicts, so `Columns`
  picks the image and label columns and returns (image, label) pairs; random draws in
  `set_transform` or `transform` run under each sample's seeds like any map-style set's;
- a streaming `datasets.IterableDataset` (`load_dataset(..., streaming=True)`): a stream of
  `num_shards` shards (`HFShards`, the shard protocol of `common.data.shards`), each opened with
  `ds.shard(num_shards, index)`. Images are read undecoded (the records the shuffle buffer holds
  are bytes) and decoded by `sample`.

Columns are found from the features (the first `Image` column, the first `ClassLabel` column),
else by name (image/img/jpg/png, label/labels/cls); `image=` and `label=` name them explicitly.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Union

from dpuoffload.common.data.shards import SHUFFLE_BUFFER, ShardedSet
from dpuoffload.common.errors import ConfigError

if TYPE_CHECKING:
    import datasets
    from PIL import Image

IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "webp")
LABEL_NAMES = ("label", "labels", "cls", "class")


def _columns(ds: Any, image: Optional[str], label: Optional[str]) -> tuple[str, str]:
    features = getattr(ds, "features", None) or {}
    names = list(features) or list(getattr(ds, "column_names", None) or [])
    kinds = {k: type(v).__name__ for k, v in features.items()}
    image = image or next((k for k in names if kinds.get(k) == "Image"), None) or \
        next((k for k in names if k.lower() in IMAGE_NAMES), None)
    label = label or next((k for k in names if kinds.get(k) == "ClassLabel"), None) or \
        next((k for k in names if k.lower() in LABEL_NAMES), None)
    if image is None or label is None:
        what = "image" if image is None else "label"
        raise ConfigError(f"dpuoffload.huggingface: no {what} column found among {', '.join(names) or '(none)'}; "
                          f"name it: dpuoffload.huggingface(ds, {what}=\"COLUMN\")")
    return image, label


def _pil(value: Any) -> Any:
    """An image column's value as a PIL image (undecoded {"bytes", "path"} dicts are decoded here)."""
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        from PIL import Image

        data = value.get("bytes")
        with (Image.open(io.BytesIO(data)) if data is not None else Image.open(value["path"])) as im:
            return im.convert("RGB")
    return value


class Columns:
    """A map-style Hugging Face data set as (image, label) pairs; `transform` applies to the image."""

    def __init__(self, ds: Any, transform: Optional[Callable[["Image.Image"], object]] = None,
                 image: Optional[str] = None, label: Optional[str] = None) -> None:
        self.ds, self.transform = ds, transform
        self.image, self.label = _columns(ds, image, label)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[object, int]:
        row = self.ds[int(i)]
        x = _pil(row[self.image])
        return (self.transform(x) if self.transform is not None else x), int(row[self.label])


class HFShards:
    """A streaming Hugging Face data set as a `ShardSource`: shard k is `ds.shard(num_shards, k)`."""

    def __init__(self, ds: Any, transform: Optional[Callable[["Image.Image"], object]] = None,
                 image: Optional[str] = None, label: Optional[str] = None) -> None:
        self.image, self.label = _columns(ds, image, label)
        n = getattr(ds, "num_shards", None) or getattr(ds, "n_shards", None)
        if not n:
            raise ConfigError("dpuoffload.huggingface: this streaming data set does not say how many shards it has "
                              "(num_shards); load it from several files (data_files=[...]) so it can be split")
        features = getattr(ds, "features", None) or {}
        if type(features.get(self.image)).__name__ == "Image":  # (records hold the bytes: decoded in `sample`)
            from datasets import Image as HFImage

            ds = ds.cast_column(self.image, HFImage(decode=False))
        self.ds, self.transform, self.count = ds, transform, int(n)
        self.shards = [str(k) for k in range(self.count)]

    def open_shard(self, shard: str) -> Iterator[dict[str, Any]]:
        # (`iter(batch_size=1)`, not `iter(ds)`: inside a DataLoader worker (--dpu-workers) the latter splits
        # the shard among the workers itself, and each worker must read the whole shard)
        for batch in self.ds.shard(num_shards=self.count, index=int(shard)).iter(batch_size=1):
            yield {k: v[0] for k, v in batch.items()}

    def sample(self, record: dict[str, Any]) -> tuple[object, int]:
        x = _pil(record[self.image])
        return (self.transform(x) if self.transform is not None else x), int(record[self.label])


def huggingface(ds: Union["datasets.Dataset", "datasets.IterableDataset"],
                transform: Optional[Callable[["Image.Image"], object]] = None, *, image: Optional[str] = None,
                label: Optional[str] = None, shuffle_buffer: int = SHUFFLE_BUFFER) -> Union[Columns, ShardedSet]:
    """A Hugging Face data set for `job.loader`: map-style as (image, label) pairs, streaming as a stream of shards.

    Args:
        ds: a `datasets.Dataset` (Arrow, map-style; `set_transform` allowed) or a streaming
            `datasets.IterableDataset`.
        transform: applied to each PIL image under the sample's seeds (a torchvision Compose:
            the uint8 wire splits it, the numerics check traces it).
        image, label: the columns, when the features do not say.
        shuffle_buffer: a stream's records per host rank's shuffle buffer.

    Returns:
        A map-style set of (image, label) pairs (`Columns`), or a `ShardedSet` for a streaming one.
    """
    if hasattr(ds, "__getitem__") and hasattr(ds, "__len__") and not _is_streaming(ds):
        return Columns(ds, transform, image, label)
    return ShardedSet(HFShards(ds, transform, image, label), shuffle_buffer, name="huggingface stream")


def _is_streaming(ds: Any) -> bool:
    return type(ds).__name__ == "IterableDataset"

"""Durable, atomic file writes (`common.files`): the whole new file or the old one, never half."""

import os

import pytest

from dpuoffload.common.files import fsync_dir, write_atomic


def test_writes_bytes_and_returns_the_path(tmp_path):
    target = tmp_path / "a.bin"
    assert write_atomic(target, b"hello") == target
    assert target.read_bytes() == b"hello"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_writer_function_streams_into_the_file(tmp_path):
    target = write_atomic(str(tmp_path / "w.bin"), lambda f: (f.write(b"ab"), f.write(memoryview(b"cd"))))
    assert target.read_bytes() == b"abcd"


def test_replaces_an_existing_file(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old contents, longer than the new")
    write_atomic(target, memoryview(b"new"))
    assert target.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")

    def half_then_fail(f):
        f.write(b"half of the new")
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError, match="disk gone"):
        write_atomic(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_parents_are_created_only_when_asked(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "x" / "a.bin", b"1")
    assert write_atomic(tmp_path / "x" / "y" / "a.bin", b"1", parents=True).read_bytes() == b"1"


def test_a_directory_in_the_way_fails_and_leaves_no_temporary(tmp_path):
    (tmp_path / "a.bin").mkdir()
    with pytest.raises(OSError):
        write_atomic(tmp_path / "a.bin", b"1", sync_dir=False)
    assert os.listdir(tmp_path) == ["a.bin"]


def test_fsync_dir_on_a_missing_directory_raises(tmp_path):
    fsync_dir(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")


def _checkpoint(root, step: int, payload: bytes):
    """A committed checkpoint directory as the keepers write it: files, manifest with their checksums, marker."""
    import hashlib
    import json

    from dpuoffload.common.state.ckptdirs import COMMITTED, MANIFEST, step_dir

    d = step_dir(root, step)
    d.mkdir(parents=True)
    (d / "shard-00000.safetensors").write_bytes(payload)
    files = {"shard-00000.safetensors": {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}}
    (d / MANIFEST).write_text(json.dumps({"files": files}))
    (d / COMMITTED).write_text(f"{step}\n")
    return d


def test_resume_latest_skips_damaged_newer_checkpoints_and_says_which(tmp_path):
    from dpuoffload.common.state.ckptdirs import CheckpointError, resolve

    good = _checkpoint(tmp_path, 4, b"four")
    torn = _checkpoint(tmp_path, 8, b"eight")
    (torn / "shard-00000.safetensors").write_bytes(b"eig")
    flipped = _checkpoint(tmp_path, 12, b"twelve")
    (flipped / "shard-00000.safetensors").write_bytes(b"twelvE")
    skipped: list[str] = []
    verified: dict[str, bytes] = {}
    assert resolve("latest", str(tmp_path), skipped, verified) == good
    assert verified == {"shard-00000.safetensors": b"four"}  # (the chosen one's files, read and checked once)
    assert skipped == [
        f"skipped damaged checkpoint {flipped}: shard-00000.safetensors is corrupt (its sha256 differs from "
        "manifest.json)",
        f"skipped damaged checkpoint {torn}: shard-00000.safetensors has 3 bytes, manifest.json says 5 (torn)"]
    assert resolve(str(flipped), None) == flipped  # an explicit choice is used as given
    (good / "shard-00000.safetensors").unlink()
    with pytest.raises(CheckpointError, match="every checkpoint in .* is damaged .*shard-00000.safetensors is missing"):
        resolve("latest", str(tmp_path))


def test_a_checkpoint_chosen_by_resume_latest_is_read_once(tmp_path, monkeypatch):
    """`--resume latest` checks every file of the checkpoint it picks; the restore then takes those
    bytes instead of reading (and hashing) the files a second time."""
    from dpuoffload.common.state import ckptdirs, ckptfiles

    d = _checkpoint(tmp_path, 4, b"four")
    verified: dict[str, bytes] = {}
    ckptdirs.resolve("latest", str(tmp_path), [], verified)
    reads = []
    monkeypatch.setattr(ckptfiles, "read_checked", lambda path, expected: reads.append(path) or (b"", "is missing"))
    manifest = ckptfiles.read_manifest(d)
    assert ckptfiles.read_verified(d, "shard-00000.safetensors", manifest, verified) == b"four" and reads == []
    with pytest.raises(ckptfiles.CheckpointError, match="is missing"):  # (without them: read from the disk)
        ckptfiles.read_verified(d, "shard-00000.safetensors", manifest)
    assert reads == [d / "shard-00000.safetensors"]

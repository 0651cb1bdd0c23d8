"""The cache stays bounded: making an entry removes those no file maps to any more (the GGUF
deleted or changed, no record, a killed build's leftovers), keeps the live ones, and a
conformance build replaces its variant's older builds only."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from recallspec.models import cache_prune, loader


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(loader.CACHE_ENV, str(root))
    return root


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copyfile(loader.default_model_path(), dst)
    return dst


def _entries(cache: Path) -> set[str]:
    return {p.name for p in (cache / "models").iterdir()}


def test_entries_whose_gguf_is_gone_or_changed_are_removed(tmp_path: Path, cache: Path) -> None:
    a, b = _copy(tmp_path, "a.gguf"), _copy(tmp_path, "b.gguf")
    ea, eb = loader.model_dir(a), loader.model_dir(b)
    assert _entries(cache) == {ea.name, eb.name}  # both files live: both kept
    record = json.loads((ea / cache_prune.SOURCE_RECORD).read_text())
    assert record == {"path": str(a.resolve()), "key": loader.file_key(a)}

    a.unlink()
    os.utime(b, ns=(time.time_ns(), b.stat().st_mtime_ns + 10**9))  # b changes: a new key
    eb2 = loader.model_dir(b)
    assert eb2 != eb
    assert _entries(cache) == {eb2.name}  # a's (file gone) and b's old one (key changed)

    c = _copy(tmp_path, "c.gguf")
    ec = loader.model_dir(c)
    assert _entries(cache) == {eb2.name, ec.name}
    assert loader.model_dir(b) == eb2  # a live entry is read again, not rebuilt


def test_unrecorded_entries_and_old_leftovers_are_removed(tmp_path: Path, cache: Path) -> None:
    models = cache / "models"
    unrecorded = models / "old-0123456789abcdef0123"
    (unrecorded / "config.json").parent.mkdir(parents=True)
    (unrecorded / "config.json").write_text("{}")
    old_tmp, new_tmp = models / "x-1.tmp-aaaa", models / "x-2.tmp-bbbb"
    old_tmp.mkdir(), new_tmp.mkdir()
    past = time.time() - cache_prune.STALE_TMP_S - 60
    os.utime(old_tmp, (past, past))
    stray = models / "notes.txt"  # not an entry: never touched
    stray.write_text("mine")

    e = loader.model_dir(_copy(tmp_path, "a.gguf"))
    assert _entries(cache) == {e.name, new_tmp.name, stray.name}


def test_a_conformance_build_replaces_only_its_variants_older_builds(tmp_path: Path) -> None:
    root = tmp_path / "conformance"
    names = ["qwen3-0123456789abcdef", "qwen3-fedcba9876543210", "qwen3-moe-0123456789abcdef",
             "gemma3-1b-0123456789abcdef", "qwen3-00000000000000aa.tmp-zz"]
    for n in names:
        (root / n).mkdir(parents=True)
    keep = root / "qwen3-0123456789abcdef"
    removed = cache_prune.prune_builds(root, keep)
    assert [p.name for p in removed] == ["qwen3-fedcba9876543210"]  # the fresh tmp stays
    assert {p.name for p in root.iterdir()} == set(names) - {"qwen3-fedcba9876543210"}

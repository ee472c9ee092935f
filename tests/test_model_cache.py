"""The model cache (sepo/builders/cache.py): a build is cached only once it has loaded and run, a
failed build leaves nothing, and the next build removes what a killed one left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sepo.builders import cache, load_model_and_tokenizer
from sepo.builders.cache import LOCKS, remove_stale_builds
from sepo.builders.tiny import TINY_FIX, build_tiny, tiny_key
from sepo.errors import ModelLoadError
from sepo.paths import CONF_DIR
from sepo.tiny_corpus import build_corpus, corpus_digest

from .conftest import model_cfg

pytestmark = pytest.mark.usefixtures("offline", "one_thread")


def entries(cache_dir: Path) -> list[str]:
    """What the cache holds besides its lock files."""
    return sorted(p.name for p in cache_dir.iterdir() if p.name != LOCKS) if cache_dir.exists() else []


def tiny_build_name(cfg) -> str:
    return f"tiny-{tiny_key(cfg, corpus_digest(build_corpus(cfg.corpus, CONF_DIR)))}"


def test_a_model_that_fails_its_first_forward_pass_is_not_cached(tmp_path):
    """3 query heads on 2 key/value heads: Qwen3 builds and saves the model, and its first forward
    pass fails. That build used to stay cached, and every later run loaded it; now each build fails in
    one line saying what to change, and the cache keeps nothing."""
    broken = model_cfg("tiny", **{"architecture.num_attention_heads": 3})
    for _ in range(2):  # the second run rebuilds and fails the same way: nothing broken was reused
        with pytest.raises(ModelLoadError) as caught:
            build_tiny(broken, tmp_path)
        message = str(caught.value)
        assert message.startswith("the tiny model built from this config does not load and run (RuntimeError: ")
        assert message.endswith(f"so nothing was cached; {TINY_FIX}")
        assert "\n" not in message
        assert entries(tmp_path) == []
    out = build_tiny(model_cfg("tiny"), tmp_path)
    assert entries(tmp_path) == [out.name]
    load_model_and_tokenizer(model_cfg("tiny"), tmp_path, device="cpu")


def test_a_build_that_fails_after_writing_its_files_leaves_nothing(tmp_path, monkeypatch):
    """The weights are written when the step after them fails (here a full disk): no directory
    remains, neither the build nor its temporary copy, and the next build succeeds."""

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache, "check_runs", disk_full)
    with pytest.raises(OSError, match="No space left"):
        build_tiny(model_cfg("tiny"), tmp_path)
    assert entries(tmp_path) == []
    monkeypatch.undo()
    out = build_tiny(model_cfg("tiny"), tmp_path)
    assert entries(tmp_path) == [out.name]


#: a build that writes 1 MB of weights into its temporary directory, says so, and sleeps there
SLOW_BUILD = """
import sys, time
from pathlib import Path
from sepo.builders.cache import cached_build

def build(tmp):
    (tmp / "model.safetensors").write_bytes(bytes(1 << 20))
    print("writing", flush=True)
    time.sleep(300)

cached_build(Path(sys.argv[1]), build, "tiny model", "")
"""


def start_build(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_BUILD, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def leftovers(cache_dir: Path, build: str) -> list[Path]:
    return sorted(cache_dir.glob(f".{build}-*"))


def test_the_next_build_removes_what_a_killed_build_left_and_keeps_a_running_ones(tmp_path):
    """A SIGKILL during a build leaves its temporary directory (400-500 MB for smollm2). The next
    build removes it, and those of older code (no lock), but not that of a build running now in another
    process, nor anything else in the cache."""
    cfg = model_cfg("tiny")
    name, running = tiny_build_name(cfg), "tiny-111111111111"
    killed, alive = start_build(tmp_path / name), start_build(tmp_path / running)
    try:
        for proc in (killed, alive):
            assert proc.stdout.readline() == "writing\n", proc.stderr.read()
        killed.kill()
        killed.wait()
        (dead_leftover,) = leftovers(tmp_path, name)
        assert (dead_leftover / name / "model.safetensors").stat().st_size == 1 << 20
        older_code = tmp_path / ".smollm2-0123456789ab-k2j4h5g6"  # a temporary dir of code without locks
        (older_code / "smollm2-0123456789ab").mkdir(parents=True)
        (tmp_path / ".my-own-notes").mkdir()

        out = build_tiny(cfg, tmp_path)

        assert out.name == name
        (running_leftover,) = leftovers(tmp_path, running)  # kept: its build is alive
        assert entries(tmp_path) == sorted([".my-own-notes", running_leftover.name, name])
    finally:
        alive.kill()
        alive.wait()
    assert remove_stale_builds(tmp_path) == [running_leftover]  # once its process is gone
    assert entries(tmp_path) == [".my-own-notes", name]

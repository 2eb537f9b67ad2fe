"""flint-nano as the embedded default (nano/embedded.py): the package carries its NVFP4 GGUF
and side files (≤ 25 MB); the first use unpacks them into the cache with BF16 shards that are
the GGUF's exact dequantisation; later uses reuse it; a damaged copy is rebuilt."""

from __future__ import annotations

import shutil

import pytest
import torch

from flint_graph.checkpoints.checkpoint import load_checkpoint
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError
from flint_graph.checkpoints.make_checkpoint import linear_slots, write_checkpoint
from flint_graph.nano import embedded


def test_the_package_carries_flint_nano():
    assert embedded.is_packaged()
    d = embedded.packaged_dir()
    assert (d / embedded.GGUF_NAME).stat().st_size <= 25 * 2**20
    assert FlintConfig.from_json(d / "config.json") == FlintConfig.preset("nano")


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    src = tmp_path / "pkg"
    write_checkpoint(FlintConfig.preset("tiny"), tmp_path / "w", ("gguf",), progress=False)
    src.mkdir()
    for name in (embedded.GGUF_NAME, *embedded.SIDE_FILES):
        shutil.copy(tmp_path / "w" / name, src / name)
    monkeypatch.setattr(embedded, "packaged_dir", lambda: src)
    monkeypatch.setenv("FLINT_GRAPH_CACHE", str(tmp_path / "cache"))
    return src


def test_unpacked_once_in_both_formats(packaged, monkeypatch, capsys):
    d = embedded.ensure_nano_checkpoint(progress=False)
    assert "unpacking flint-nano" in capsys.readouterr().err
    bf16 = load_checkpoint(d, device="cpu", progress=False)
    fp4 = load_checkpoint(d / embedded.GGUF_NAME, device="cpu", progress=False)
    assert bf16.format.value == "bf16" and fp4.format.value == "nvfp4"
    for (o1, n, _), (o2, _, _) in zip(linear_slots(bf16.weights), linear_slots(fp4.weights)):
        assert torch.equal(getattr(o1, n), getattr(o2, n).dequantize(torch.bfloat16)), n
    monkeypatch.setattr(embedded, "_build", lambda *a: pytest.fail("rebuilt a good copy"))
    assert embedded.ensure_nano_checkpoint(progress=False) == d
    monkeypatch.undo()
    monkeypatch.setattr(embedded, "packaged_dir", lambda: packaged)
    monkeypatch.setenv("FLINT_GRAPH_CACHE", str(d.parent))
    with (d / "config.json").open("a") as f:  # damaged: sizes no longer match the marker
        f.write(" ")
    assert embedded.ensure_nano_checkpoint(progress=False) == d
    assert load_checkpoint(d, device="cpu", progress=False).cfg == bf16.cfg


def test_missing_files_are_named(packaged):
    (packaged / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="flint-nano's files are missing"):
        embedded.ensure_nano_checkpoint(progress=False)


def test_a_cache_under_a_file_names_that_file(packaged, tmp_path, monkeypatch):
    """A bad-input trial (2026-12-05): HOME set to a regular file said "[Errno 20] Not a
    directory: '.../flint-nano-995076df9e0b.partial-13997'"."""
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.delenv("FLINT_GRAPH_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(CheckpointError, match=f"{home} is a file, not a directory") as e:
        embedded.ensure_nano_checkpoint(progress=False)
    assert "partial" not in str(e.value) and "Errno" not in str(e.value)


def test_a_second_unpack_finishing_first_keeps_its_copy(packaged, monkeypatch):
    """Two first runs at once (two terminals, parallel test workers): before, both wrote one
    `.partial` directory, and the second to start deleted the first's half-written files."""
    real = embedded._build

    def other_process_finishes_first(src, out, digest, progress):
        monkeypatch.setattr(embedded, "_build", real)
        embedded.ensure_nano_checkpoint(progress=False)  # the "other process", to the end
        (out / "config.json").touch()
        mark = (out / "config.json").stat().st_mtime_ns
        real(src, out, digest, progress)  # ours finishes second and must not replace it
        assert (out / "config.json").stat().st_mtime_ns == mark

    monkeypatch.setattr(embedded, "_build", other_process_finishes_first)
    d = embedded.ensure_nano_checkpoint(progress=False)
    assert [p.name for p in d.parent.iterdir()] == [d.name]  # no partial directory left
    assert load_checkpoint(d, device="cpu", progress=False).cfg == FlintConfig.preset("tiny")


@pytest.mark.parametrize("damage", ["tokenizer", "weights"])
def test_a_copy_damaged_in_place_is_unpacked_again_by_llm(packaged, capsys, damage):
    """A bad-input trial (2026-12-05): bytes changed in the unpacked copy without changing its
    size (1,000 bytes of a shard set to 0xFF: NaN weights; one byte of tokenizer.json) passed
    the size check, and every later run failed on a path the user never named. `LLM()` on the
    embedded default now unpacks it again once when it does not load, saying so."""
    from flint_graph import LLM, SamplingParams

    d = embedded.ensure_nano_checkpoint(progress=False)
    capsys.readouterr()
    if damage == "tokenizer":
        path = d / "tokenizer.json"
        data = bytearray(path.read_bytes())
        data[data.index(b'"')] = ord("{")  # same size, no longer JSON
    else:
        path = next(d.glob("*.safetensors"))
        data = bytearray(path.read_bytes())
        mid = len(data) // 2
        data[mid:mid + 1000] = b"\xff" * 1000
    path.write_bytes(bytes(data))
    assert embedded.ensure_nano_checkpoint(progress=False) == d  # sizes alone: "complete"
    llm = LLM(device="cpu", progress=False, engine="reference")
    err = capsys.readouterr().err
    assert "did not load" in err and "unpacking it again" in err and str(d) in err
    assert llm.generate(["hi"], SamplingParams(max_tokens=2))[0].finish_reason == "length"
    LLM(device="cpu", progress=False, engine="reference")  # the fresh copy: no second unpack
    assert "unpacking" not in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["config", "generation_config"])
def test_damaged_side_files_of_the_default_are_unpacked_again(packaged, capsys, damage):
    """A second bad-input trial (2026-12-05): same-size damage to the unpacked config.json
    ("flint" -> "flinx") raised ConfigError, which the repair did not catch, and a bad
    eos_token_id in generation_config.json surfaced only per request, blamed on the caller."""
    from flint_graph import LLM, SamplingParams

    d = embedded.ensure_nano_checkpoint(progress=False)
    capsys.readouterr()
    if damage == "config":
        path, old, new = d / "config.json", b'"flint"', b'"flinx"'
    else:
        path = d / "generation_config.json"
        import re

        m = re.search(rb'"eos_token_id": \[?\s*(\d+)', path.read_bytes())
        old = m.group(0)
        new = old[:-len(m.group(1))] + b"9" * len(m.group(1))
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))
    llm = LLM(device="cpu", progress=False, engine="reference")
    err = capsys.readouterr().err
    assert "did not load" in err and "unpacking it again" in err
    assert llm.generate(["hi"], SamplingParams(max_tokens=2))[0].finish_reason == "length"


@pytest.mark.parametrize("error", ["oserror", "safetensors"])
def test_a_full_disk_while_unpacking_leaves_nothing_and_names_the_path(packaged, monkeypatch,
                                                                       error):
    """A bad-input trial (2026-12-06, the cache on a 20 MB tmpfs): each first run left its
    `.partial-<pid>` directory behind (12 MB, then 8 MB: the disk stayed full) and the first
    said only `internal error: SafetensorError: ... No space left on device`."""
    from safetensors import SafetensorError

    from flint_graph.checkpoints import hf_checkpoint

    def full_disk(*a, **k):
        if error == "oserror":
            raise OSError(28, "No space left on device")
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    monkeypatch.setattr(hf_checkpoint, "write_safetensors", full_disk)
    with pytest.raises(CheckpointError, match=r"cannot unpack flint-nano .*No space left.*"
                                              r"writable directory with \d+ MB free"):
        embedded.ensure_nano_checkpoint(progress=False)
    cache = embedded.cache_root()
    assert not cache.exists() or list(cache.iterdir()) == []  # no partial directory left


def test_a_killed_first_unpack_is_swept_by_the_next(packaged):
    """A bad-input trial (2026-12-06): SIGTERM during the first unpack left its
    `.partial-<pid>` directory for good (a killed process runs no cleanup). The next unpack
    removes partial directories whose process is gone, and leaves a live one's alone."""
    import subprocess

    cache = embedded.cache_root()
    out = embedded.ensure_nano_checkpoint(progress=False)
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = out.with_name(f"{out.name}.partial-{gone.pid}")
    live = out.with_name(f"{out.name}.partial-1")  # pid 1 is always alive
    for d in (dead, live):
        d.mkdir()
        (d / "half.safetensors").write_bytes(b"x" * 100)
    embedded.ensure_nano_checkpoint(progress=False, fresh=True)
    assert not dead.exists() and live.exists()
    assert cache.is_dir()


def test_an_empty_home_is_not_the_filesystem_root(monkeypatch):
    """A bad-input trial (2026-12-06): with HOME="" (and no FLINT_GRAPH_CACHE or
    XDG_CACHE_HOME) flint-nano was unpacked into /.cache: Path.home() reads an empty HOME as
    "/". The account's home directory is used instead."""
    import pwd

    from flint_graph.paths import cache_root

    monkeypatch.delenv("FLINT_GRAPH_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "")
    import os
    from pathlib import Path

    assert cache_root() == Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "flint_graph"
    monkeypatch.setenv("HOME", "/tmp/h")
    assert cache_root() == Path("/tmp/h/.cache/flint_graph")


def test_cache_paths_from_the_environment_are_absolute(monkeypatch, tmp_path):
    """A bad-input trial (2026-12-06): FLINT_GRAPH_CACHE="~/x" (unexpanded, as from a .env
    file) unpacked 45 MB into a directory named "~" in the working directory, and a relative
    XDG_CACHE_HOME was used from whatever the working directory was."""
    from pathlib import Path

    from flint_graph.paths import cache_root

    monkeypatch.setenv("HOME", "/tmp/h")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLINT_GRAPH_CACHE", "~/x")
    assert cache_root() == Path("/tmp/h/x")
    monkeypatch.setenv("FLINT_GRAPH_CACHE", "rel/cache")
    assert cache_root() == tmp_path / "rel" / "cache"
    monkeypatch.delenv("FLINT_GRAPH_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert cache_root() == Path("/tmp/h/.cache/flint_graph")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert cache_root() == Path("/tmp/h/xdg/flint_graph")

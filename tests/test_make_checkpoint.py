"""The synthetic checkpoint generator and the embedded default (flint_graph/checkpoints/make_checkpoint.py,
DESIGN §2 "Synthetic checkpoints").

Exact comparisons throughout (torch.equal, file hashes): the generator is deterministic and its
weights sit on the NVFP4 grid with power-of-two scale2, so BF16 and NVFP4 hold identical values.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flint_graph.checkpoints import make_checkpoint as mk
from flint_graph.checkpoints import nvfp4
from flint_graph.checkpoints.checkpoint import WeightFormat, load_checkpoint
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError, ConfigError
from flint_graph.checkpoints.synthetic import make_weights
from flint_graph.chat.tokenizer import FlintTokenizer
from flint_graph.checkpoints.weights import MoEWeights, NVFP4Weight

SEED = 5
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg():
    return FlintConfig.preset("tiny")


@pytest.fixture(scope="module")
def written(cfg, tmp_path_factory):
    d = tmp_path_factory.mktemp("mk") / "tiny"
    return mk.write_checkpoint(cfg, d, seed=SEED, device="cpu", progress=False)


def linears(w):
    """(name, linear) for every quantised linear of FlintWeights."""
    out = []
    for i, lw in enumerate(w.layers):
        out += [(f"{i}.{n}", getattr(lw, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mlp = lw.ffn
        if isinstance(lw.ffn, MoEWeights):
            out += [(f"{i}.exps.{n}", getattr(lw.ffn, n)) for n in ("gate", "up", "down")]
            mlp = lw.ffn.shared
        out += [(f"{i}.mlp.{n}", getattr(mlp, n)) for n in ("gate", "up", "down")]
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_file_written(cfg, written):
    d = written["out_dir"]
    names = {p.name for p in d.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors.index.json", mk.GGUF_NAME, mk.MARKER_NAME} <= names
    assert any(n.startswith("model-00001-of-") for n in names)
    assert FlintConfig.from_json(d) == cfg
    assert json.loads((d / "config.json").read_text()) == cfg.to_dict()
    assert written["files"] == {p.name: p.stat().st_size for p in d.iterdir()
                                if p.name != mk.MARKER_NAME}
    assert not list(d.parent.glob(".tiny.tmp-*"))  # the temporary directory was renamed away


def test_generation_config_defaults_and_eos_ids(written):
    d = written["out_dir"]
    gen = json.loads((d / "generation_config.json").read_text())
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (1.0, 0.95, 20)
    tok = FlintTokenizer.from_dir(d)
    want = [tok.token_id(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    assert gen["eos_token_id"] == want and len(set(want)) == 3
    assert gen["pad_token_id"] == tok.token_id("<|endoftext|>")
    assert json.loads((d / "tokenizer_config.json").read_text())["chat_template"]


def test_bf16_and_gguf_dequantise_bit_identical(cfg, written):
    d = written["out_dir"]
    bf = load_checkpoint(d, progress=False)
    q = load_checkpoint(d / mk.GGUF_NAME, progress=False)
    assert bf.format is WeightFormat.BF16 and q.format is WeightFormat.NVFP4
    for (name, a), (_, b) in zip(linears(bf.weights), linears(q.weights)):
        assert isinstance(a, torch.Tensor) and isinstance(b, NVFP4Weight), name
        assert torch.equal(a, b.dequantize(torch.bfloat16)), name
        # scale2 is a power of two (per expert for stacks), which is what makes this exact
        assert torch.equal(torch.exp2(torch.log2(b.scale2).round()), b.scale2), name
        assert b.scale2.dim() == (1 if name.split(".")[1] == "exps" else 0), name
    for x, y in zip(bf.weights.layers, q.weights.layers):
        for n in ("attn_norm", "ffn_norm", "q_norm", "k_norm", "sinks"):
            assert torch.equal(getattr(x, n), getattr(y, n)), n
        if hasattr(x.ffn, "router"):
            assert torch.equal(x.ffn.router, y.ffn.router)
            assert torch.equal(x.ffn.router_bias, y.ffn.router_bias)
    # embedding and LM head stay BF16 (not snapped) in both formats by default
    ref = make_weights(cfg, SEED)
    for a, b, r in ((bf.weights.embed, q.weights.embed, ref.embed),
                    (bf.weights.lm_head, q.weights.lm_head, ref.lm_head)):
        assert torch.equal(a, b) and torch.equal(a, r)


def test_snapped_weights_are_the_nvfp4_quantisation_of_the_synthetic_ones(cfg, written):
    q = load_checkpoint(written["out_dir"] / mk.GGUF_NAME, progress=False)
    ref = make_weights(cfg, SEED)
    for (name, r), (_, b) in zip(linears(ref), linears(q.weights)):
        per_expert = name.split(".")[1] == "exps"
        s2 = nvfp4.choose_scale2(r, per_expert)
        codes, scales = nvfp4.quantize(r, s2)
        assert torch.equal(codes, b.codes) and torch.equal(scales, b.scales), name
        assert torch.equal(s2, b.scale2), name


def test_same_seed_same_bytes_other_seed_differs(cfg, written, tmp_path):
    again = mk.write_checkpoint(cfg, tmp_path / "again", seed=SEED, device="cpu", progress=False)
    a, b = written["out_dir"], again["out_dir"]
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for p in a.iterdir():
        assert sha256(p) == sha256(b / p.name), p.name
    other = mk.write_checkpoint(cfg, tmp_path / "other", seed=SEED + 1, formats=("gguf",),
                                device="cpu", progress=False)["out_dir"]
    assert sha256(other / mk.GGUF_NAME) != sha256(a / mk.GGUF_NAME)
    assert not list(other.glob("*.safetensors"))


def test_quantize_embeddings_option(cfg, tmp_path):
    d = mk.write_checkpoint(cfg, tmp_path / "qe", seed=SEED, device="cpu", progress=False,
                            quantize_embeddings=True)["out_dir"]
    bf = load_checkpoint(d, progress=False)
    q = load_checkpoint(d / mk.GGUF_NAME, progress=False)
    for a, b in ((bf.weights.embed, q.weights.embed), (bf.weights.lm_head, q.weights.lm_head)):
        assert isinstance(b, NVFP4Weight) and torch.equal(a, b.dequantize(torch.bfloat16))


def test_interrupted_write_leaves_nothing(cfg, tmp_path, monkeypatch):
    import flint_graph.checkpoints.gguf_checkpoint as gc

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gc, "write_gguf", boom)
    with pytest.raises(KeyboardInterrupt):
        mk.write_checkpoint(cfg, tmp_path / "half", device="cpu", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_refused(cfg, written, tmp_path):
    with pytest.raises(CheckpointError, match="already exists and is not empty"):
        mk.write_checkpoint(cfg, written["out_dir"], device="cpu", progress=False)
    with pytest.raises(ConfigError, match="formats"):
        mk.write_checkpoint(cfg, tmp_path / "x", formats=("fp8",), progress=False)
    with pytest.raises(ConfigError, match="formats"):
        mk.write_checkpoint(cfg, tmp_path / "x", formats=(), progress=False)
    assert not (tmp_path / "x").exists()


def test_tiny_checkpoint_built_once_then_reused(cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLINT_GRAPH_CACHE", str(tmp_path / "cache"))
    d = mk.tiny_checkpoint_dir()
    assert d == tmp_path / "cache" / "tiny-seed0"
    assert mk.ensure_tiny_checkpoint(progress=False) == d
    assert "building the tiny checkpoint" in capsys.readouterr().err
    assert mk.is_complete(d, cfg, 0, mk.FORMATS)
    assert load_checkpoint(d, progress=False).cfg == cfg
    stamps = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cached default checkpoint was rebuilt")

    monkeypatch.setattr(mk, "write_checkpoint", no_rebuild)
    assert mk.ensure_tiny_checkpoint(progress=False) == d
    assert capsys.readouterr().err == ""
    assert stamps == {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    # a damaged cache (a file shorter than the marker records) is rebuilt, not trusted
    monkeypatch.undo()
    monkeypatch.setenv("FLINT_GRAPH_CACHE", str(tmp_path / "cache"))
    with (d / mk.GGUF_NAME).open("r+b") as f:
        f.truncate(100)
    assert not mk.is_complete(d, cfg, 0, mk.FORMATS)
    mk.ensure_tiny_checkpoint(progress=False)
    assert mk.is_complete(d, cfg, 0, mk.FORMATS)


@pytest.mark.parametrize("where,error", [
    ("safetensors", "safetensors"), ("safetensors", "enospc"), ("gguf", "enospc"),
    ("gguf", "edquot"), ("gguf", "efbig"), ("gguf", "numpy"), ("safetensors", "rust")])
def test_a_full_disk_is_named_with_the_room_needed(cfg, tmp_path, monkeypatch, capsys, where,
                                                   error):
    """Bad-input trials (2026-12-06, the output on a small tmpfs or under `ulimit -f`):
    `make-checkpoint` said `internal error: SafetensorError: ... No space left on device`,
    `OSError: 4608 requested and 1024 written` (numpy, no errno), `Exception: ... (os error
    28)` (tokenizers) or `File too large (os error 27)`. Now one line naming the output and the
    room its formats need, exit 2, nothing left behind, the directories made for it too."""
    import errno

    from safetensors import SafetensorError

    import flint_graph.checkpoints.gguf_checkpoint as gc

    def full(*args, **kwargs):
        if error == "safetensors":
            raise SafetensorError("Error while serializing: I/O error: No space left on device")
        if error == "numpy":
            raise OSError("4608 requested and 1024 written")
        if error == "rust":
            raise Exception("No space left on device (os error 28)")
        code = {"enospc": errno.ENOSPC, "edquot": errno.EDQUOT, "efbig": errno.EFBIG}[error]
        raise OSError(code, os.strerror(code), "model-nvfp4.gguf")

    monkeypatch.setattr(mk if where == "safetensors" else gc,
                        "write_safetensors" if where == "safetensors" else "write_gguf", full)
    out = tmp_path / "new" / "deeper" / "ck"
    assert mk.main(["--preset", "tiny", "--out", str(out), "--device", "cpu",
                    "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out) in err and re.search(r"\d MB free", err), err
    assert "internal error" not in err
    assert list(tmp_path.iterdir()) == []  # new/deeper, made for it, are gone too


def test_outputs_the_final_rename_cannot_take_are_refused_first(cfg, tmp_path, monkeypatch):
    """A bad-input trial (2026-12-06): a symbolic link to an empty directory and an empty
    mount point (a Docker volume) failed at the final rename, after all the work, with an
    internal error (NotADirectoryError, EBUSY); a parent that is a file said "File exists".
    Each is refused before any work; another OSError of the write is named, not a traceback."""
    import errno

    import flint_graph.checkpoints.gguf_checkpoint as gc

    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="is a symbolic link; pass the directory"):
        mk.write_checkpoint(cfg, tmp_path / "link", device="cpu", progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="file is a file, not a directory"):
        mk.write_checkpoint(cfg, tmp_path / "file" / "ck", device="cpu", progress=False)
    monkeypatch.setattr(os.path, "ismount", lambda p: str(p) == str(tmp_path / "empty"))
    with pytest.raises(CheckpointError, match="is a mount point.*inside it"):
        mk.write_checkpoint(cfg, tmp_path / "empty", device="cpu", progress=False)
    monkeypatch.setattr(gc, "write_gguf", lambda *a, **k: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, "Permission denied")))
    with pytest.raises(CheckpointError, match=r"ck: cannot write the checkpoint \(Permission"):
        mk.write_checkpoint(cfg, tmp_path / "ck", device="cpu", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "link"]


def test_sigterm_removes_the_partial_output(tmp_path, monkeypatch, capsys):
    """A bad-input trial (2026-12-06): `timeout -s TERM 3 flint-graph make-checkpoint ...`
    exited 143 with no message and left a hidden `.ck.tmp-*` directory per run. SIGTERM now
    runs Ctrl-C's cleanup: nothing left, `flint-graph: terminated`, 143."""
    import signal

    import flint_graph.checkpoints.gguf_checkpoint as gc
    from flint_graph.cli import main

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(gc, "write_gguf",
                        lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM) or 0)
    out = tmp_path / "new" / "ck"
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "flint-graph: terminated"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_cli_main(tmp_path, capsys):
    out = tmp_path / "cli"
    assert mk.main(["--preset", "tiny", "--out", str(out), "--format", "bf16", "--seed", "3",
                    "--device", "cpu", "--no-progress"]) == 0
    assert (out / "model.safetensors.index.json").is_file() and not (out / mk.GGUF_NAME).exists()
    assert "wrote" in capsys.readouterr().out
    assert mk.main(["--out", str(out), "--no-progress"]) == 2  # exists: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err and "Traceback" not in err
    cfg_path = tmp_path / "c.json"
    cfg_path.write_text(json.dumps({**FlintConfig.preset("tiny").to_dict(), "hidden_size": 50}))
    assert mk.main(["--config", str(cfg_path), "--out", str(tmp_path / "c"),
                    "--no-progress"]) == 2
    assert "hidden_size" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["--format", ""], "--format '': empty; expected a comma-separated list of bf16 and gguf"),
    (["--format", ",,,"], "--format ',,,': an empty item"),
    (["--format", "gguf,"], "--format 'gguf,': an empty item"),  # was dropped (a trial)
    (["--format", ",gguf"], "--format ',gguf': an empty item"),
    (["--format", "gguf,,bf16"], "--format 'gguf,,bf16': an empty item"),
    (["--format", "BF16"], "--format 'BF16': 'BF16' unknown"),
    (["--format", "bf16,bf16"], "--format 'bf16,bf16': bf16 given twice"),
    (["--format", "bf16", "--quantize-embeddings"],
     "--quantize-embeddings stores the embedding and LM head as NVFP4 in the GGUF; --format "
     "has no gguf"),
])  # fmt: skip
def test_bad_format_lists_name_the_flag(tmp_path, capsys, argv, words):
    """--format's errors name the flag and the value typed (they spoke of `formats ['BF16']`),
    a format given twice is refused as for bench and eval, and --quantize-embeddings without
    a GGUF is refused instead of ignored (a bad-input trial, 2026-12-06); nothing is written."""
    out = tmp_path / "f"
    assert mk.main(["--preset", "tiny", "--out", str(out), "--device", "cpu", "--no-progress",
                    *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_tool_script_reports_errors_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(REPO / "tools" / "make_checkpoint.py"),
                        "--out", str(tmp_path / "t"), "--format", "bf16,fp8"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--format 'bf16,fp8': 'fp8' unknown" in r.stderr and r.stderr.count("\n") == 1 \
        and "Traceback" not in r.stderr


def test_every_flag_has_help(capsys):
    with pytest.raises(SystemExit) as e:
        mk.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--preset", "--config", "--out", "--format", "--seed", "--device",
                 "--quantize-embeddings", "--overwrite", "--no-progress"):
        assert flag in text
    parser = argparse.ArgumentParser()
    mk.add_arguments(parser)
    assert all(a.help for a in parser._actions)


def _leaves(x, prefix=""):
    """(path, tensor) for every tensor inside FlintWeights (NVFP4Weight fields included)."""
    if isinstance(x, torch.Tensor):
        return [(prefix, x)]
    if isinstance(x, (list, tuple)):
        return [kv for i, v in enumerate(x) for kv in _leaves(v, f"{prefix}.{i}")]
    if hasattr(x, "__dict__"):
        return [kv for k, v in vars(x).items() for kv in _leaves(v, f"{prefix}.{k}")]
    return []


def test_nvfp4_made_layer_by_layer_equals_quantising_the_bf16_model(cfg):
    """make_nvfp4_weights (each layer snapped as it is made) gives the tensors of make_weights
    followed by quantize_weights, bit for bit."""
    want = mk.quantize_weights(make_weights(cfg, SEED), progress=False)
    got = mk.make_nvfp4_weights(cfg, SEED)
    a, b = _leaves(want), _leaves(got)
    assert [k for k, _ in a] == [k for k, _ in b] and len(a) > 20
    for (k, x), (_, y) in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y), k
    assert any(isinstance(lin, NVFP4Weight) for _, lin in linears(got))


def test_weights_bytes_by_format():
    """The full config: ~79 GB in BF16, ~25 GB as NVFP4 made layer by layer (fits an 80 GB
    H100 with room for the KV cache); the refusal names the format and the sizes."""
    full = FlintConfig.preset("full")
    assert 78e9 < mk.weights_bytes(full) < 81e9
    assert 20e9 < mk.weights_bytes(full, "nvfp4") < 28e9
    tiny = FlintConfig.preset("tiny")
    assert mk.weights_bytes(tiny, "nvfp4") < mk.weights_bytes(tiny)


def test_check_memory_names_the_format(monkeypatch):
    full = FlintConfig.preset("full")
    monkeypatch.setattr(mk.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                         "SC_PHYS_PAGES": 10 * 2**30 // 4096}[name])
    with pytest.raises(ConfigError, match=r"BF16 weights need 79\.\d GB, more than 90% of the "
                       r"10\.7 GB that cpu has; use") as info:
        mk.check_memory(full, torch.device("cpu"))
    assert "NVFP4 weights alone" not in str(info.value)  # it would not fit either
    with pytest.raises(ConfigError, match=r"NVFP4 weights need 2\d\.\d GB"):
        mk.check_memory(full, torch.device("cpu"), "nvfp4")


def test_gguf_alone_is_made_layer_by_layer_with_the_same_bytes(cfg, written, tmp_path):
    """--format gguf makes the weights as NVFP4 layer by layer (no BF16 model in memory) and
    writes the GGUF byte for byte as the run that writes both formats."""
    out = mk.write_checkpoint(cfg, tmp_path / "g", formats=("gguf",), seed=SEED, device="cpu",
                              progress=False)
    assert sha256(Path(out["out_dir"]) / mk.GGUF_NAME) == sha256(
        Path(written["out_dir"]) / mk.GGUF_NAME)


def test_check_memory_names_the_callers_flag(monkeypatch):
    full = FlintConfig.preset("full")
    monkeypatch.setattr(mk.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                         "SC_PHYS_PAGES": 50 * 2**30 // 4096}[name])
    with pytest.raises(ConfigError, match=r"BF16 .* need 24\.9 GB \(--format gguf\); use"):
        mk.check_memory(full, torch.device("cpu"), nvfp4_flag="--format gguf")
    mk.check_memory(full, torch.device("cpu"), "nvfp4")  # 24.9 GB fits 50 GiB


def test_trace_and_bench_name_their_own_nvfp4_flag(monkeypatch):
    """A BF16 refusal's hint names the flag of the command that was run (trace has --format,
    bench --formats), and only where NVFP4 alone would fit."""
    from flint_graph.perf.bench import BenchOptions, sources

    monkeypatch.setattr(mk.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096,
                                                         "SC_PHYS_PAGES": 50 * 2**30 // 4096}[name])
    for flag in ("--formats nvfp4", "--format nvfp4"):
        o = BenchOptions(preset="full", device="cpu", progress=False, nvfp4_flag=flag)
        with pytest.raises(ConfigError, match=rf"need 24\.9 GB \({flag}\)"):
            next(sources(o, 1024))


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path):
    """A bad-input trial (2026-12-06): `flint-graph make-checkpoint ... | head -1` exited 1
    (rich's broken-pipe exit) with the checkpoint complete; `generate | head` exits 0."""
    script = ("import sys; from flint_graph.cli import main; "
              "sys.exit(main(['make-checkpoint', '--preset', 'tiny', '--no-progress', "
              f"'--out', {str(tmp_path / 'ck')!r}]))")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the summary is printed
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert "Traceback" not in err and (tmp_path / "ck" / "config.json").is_file(), err


def test_a_config_whose_vocab_is_too_small_is_named(tmp_path, capsys):
    """A bad-input trial (2026-12-06): `make-checkpoint --config C` with vocab_size 100 failed
    deep in the write with "vocab_size: expected >= 276", naming no file."""
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.cli import main

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({**FlintConfig.preset("tiny").to_dict(), "vocab_size": 100}))
    assert main(["make-checkpoint", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: vocab_size 100: a synthetic checkpoint's tokenizer needs at least 276" in err
    assert not (tmp_path / "o").exists()

"""tools/train_nano.py on the CPU (tiny config): it trains, resumes from its state, and exports
a checkpoint whose BF16 shards are exactly the dequantised NVFP4 GGUF, loadable by the runtime."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from tool_module import TOOLS, tool_module

from flint_graph.checkpoints.checkpoint import load_checkpoint
from flint_graph.checkpoints.make_checkpoint import linear_slots

TOOL = TOOLS / "train_nano.py"
FAST = ["--preset", "tiny", "--device", "cpu", "--batch", "2", "--recall-pairs", "5",
        "--log-every", "1"]


def _run(*args: str) -> str:
    out = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_train_resume_export(tmp_path):
    state = tmp_path / "state"
    _run("--state", str(state), "--steps", "2", *FAST)
    assert "at step 3" in _run("--state", str(state), "--steps", "1", *FAST)  # resumed
    steps = [json.loads(x)["step"] for x in (state / "loss.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    ck = tmp_path / "ckpt"
    _run("--state", str(state), "--preset", "tiny", "--export", str(ck))
    bf16 = load_checkpoint(ck, device="cpu", progress=False)
    fp4 = load_checkpoint(ck / "model-nvfp4.gguf", device="cpu", progress=False)
    assert bf16.format.value == "bf16" and fp4.format.value == "nvfp4"
    pairs = list(zip(linear_slots(bf16.weights), linear_slots(fp4.weights)))
    assert pairs
    for (o1, name, _), (o2, _, _) in pairs:
        assert torch.equal(getattr(o1, name), getattr(o2, name).dequantize(torch.bfloat16)), name
    assert torch.equal(bf16.weights.lm_head, fp4.weights.lm_head)


def test_pad_batch_marks_next_token_targets_and_answer_digits(tmp_path):
    import random

    from flint_graph.checkpoints.make_checkpoint import ensure_tiny_checkpoint
    from flint_graph.nano.curriculum import recall, supervised
    from flint_graph.chat.tokenizer import FlintTokenizer

    mod = tool_module("train_nano")
    tok = FlintTokenizer.from_dir(ensure_tiny_checkpoint(progress=False))
    eps = [recall(random.Random(s), "train", pairs=6, questions=2) for s in range(2)]
    b = mod.pad_batch(eps, tok)
    for r, e in enumerate(eps):
        ids, mask = supervised(e, tok)
        n = len(ids)
        assert b["ids"][r, :n].tolist() == ids
        assert b["mask"][r, :n - 1].tolist() == mask[1:] and not b["mask"][r, n - 1:].any()
        # the answer positions predict exactly the answers' tokens (and what follows them)
        predicted = [ids[t + 1] for t in range(n - 1) if b["answer"][r, t]]
        answers = "".join(str(a) for a in e.meta["answers"])
        assert answers in tok.decode(predicted)


def test_init_starts_a_new_state_from_an_exported_checkpoint(tmp_path):
    # state.pt is gitignored and gone on a fresh machine: --init picks training up from the
    # exported model, and exporting that state again gives back the same weights (the NVFP4
    # snap of an NVFP4 value is itself).
    state, ck = tmp_path / "state", tmp_path / "ckpt"
    _run("--state", str(state), "--steps", "1", *FAST)
    _run("--state", str(state), "--preset", "tiny", "--export", str(ck))
    for i, src in enumerate((ck, ck / "model-nvfp4.gguf")):
        new, again = tmp_path / f"new{i}", tmp_path / f"again{i}"
        assert "at step 8" in _run("--state", str(new), "--init", str(src), "--first-step", "7",
                                   "--steps", "1", *FAST)
        steps = [json.loads(x)["step"] for x in (new / "loss.jsonl").read_text().splitlines()]
        assert steps == [8]
        fresh = tmp_path / f"fresh{i}"  # no training step: the export must round-trip exactly
        _run("--state", str(fresh), "--preset", "tiny", "--init", str(src), "--steps", "0",
             "--device", "cpu")
        _run("--state", str(fresh), "--preset", "tiny", "--export", str(again))
        a = load_checkpoint(ck, device="cpu", progress=False).weights
        b = load_checkpoint(again, device="cpu", progress=False).weights
        from flint_graph.checkpoints.weights import _walk
        for x, y in zip(_walk(a), _walk(b)):
            assert torch.equal(x, y)


def test_init_from_the_shipped_checkpoint_keeps_its_tokenizer(tmp_path):
    # side_files would train a tokenizer from today's curriculum, which is not the one the
    # shipped weights were trained with: a new state must take the checkpoint's own.
    from flint_graph.nano.embedded import SIDE_FILES, packaged_dir
    from flint_graph.checkpoints.weights import NVFP4Weight, _walk

    nano, state, again = packaged_dir(), tmp_path / "state", tmp_path / "again"
    _run("--state", str(state), "--init", str(nano), "--first-step", "5930", "--steps", "0",
         "--device", "cpu")
    _run("--state", str(state), "--export", str(again))
    for name in SIDE_FILES:
        assert (again / name).read_bytes() == (nano / name).read_bytes(), name
    a = load_checkpoint(nano, device="cpu", progress=False).weights
    b = load_checkpoint(again / "model-nvfp4.gguf", device="cpu", progress=False).weights
    for x, y in zip(_walk(a), _walk(b)):
        if isinstance(x, NVFP4Weight):
            x, y = x.dequantize(torch.float32), y.dequantize(torch.float32)
        assert torch.equal(x, y)


def test_init_refuses_an_existing_state_and_another_config(tmp_path):
    state = tmp_path / "state"
    _run("--state", str(state), "--steps", "1", *FAST)
    out = subprocess.run([sys.executable, str(TOOL), "--state", str(state), "--init",
                          str(tmp_path), *FAST], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "exists" in out.stderr and "Traceback" not in out.stderr
    from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

    nano = ensure_default_checkpoint(progress=False)
    out = subprocess.run([sys.executable, str(TOOL), "--state", str(tmp_path / "s2"), "--init",
                          str(nano), *FAST], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--preset 'tiny'" in out.stderr, out.stderr[-500:]
    assert "hidden_size 256 (--preset: 64)" in out.stderr  # names what differs
    assert "Traceback" not in out.stderr


def test_bad_state_paths_and_a_checkpoint_without_its_tokenizer_are_refused(tmp_path):
    import shutil

    from flint_graph.nano.embedded import GGUF_NAME, packaged_dir

    def refused(*args: str) -> str:
        out = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-800:]
        return out.stderr

    f = tmp_path / "file"
    f.write_text("mine")
    assert "a file; expected a state directory" in refused("--state", str(f), *FAST)
    assert f.read_text() == "mine"
    (tmp_path / "d" / "state.pt").mkdir(parents=True)
    assert "is not a file" in refused("--state", str(tmp_path / "d"), *FAST)
    assert "--export trains nothing" in refused("--state", str(tmp_path / "e"), "--first-step",
                                                "3", "--export", str(tmp_path / "x"), *FAST)
    # weights without their tokenizer: a regenerated one would be another (its merges differ)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", GGUF_NAME):
        shutil.copy(packaged_dir() / name, bare / name)
    err = refused("--state", str(tmp_path / "s"), "--init", str(bare), "--device", "cpu")
    assert "no tokenizer.json or tokenizer_config.json" in err
    assert not (tmp_path / "s" / "state.pt").exists()

"""tools/train_nano.py on the CPU (tiny config): it trains, resumes from its state, and exports
a checkpoint whose BF16 shards are exactly the dequantised NVFP4 GGUF, loadable by the runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from flint_graph.checkpoint import load_checkpoint
from flint_graph.make_checkpoint import linear_slots

TOOL = Path(__file__).resolve().parent.parent / "tools" / "train_nano.py"
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

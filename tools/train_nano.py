#!/usr/bin/env python3
"""Train flint-nano with NVFP4 quantisation-aware training (issue 11), resumably, and export it.

    python tools/train_nano.py --state DIR [--preset nano] [--minutes 9] [--device cuda]
    python tools/train_nano.py --state DIR --export CKPT_DIR     # BF16 shards + NVFP4 GGUF

Each run continues from DIR/state.pt when it exists (master weights, optimiser, step; small
enough to carry between device runs) and stops after --minutes or --steps, saving the state.
Every step draws fresh episodes of the curriculum (nano/curriculum.py) for that step's seed, so
a resumed run sees new data; the recall episodes grow with the step (--recall-pairs, up to
--recall-max). The loss curve goes to DIR/loss.jsonl (one line per --log-every steps).
The export's GGUF holds exactly the NVFP4 values the forward pass trained on, and its BF16
shards are their exact dequantisation (nano/qat.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from flint_graph.config import FlintConfig
from flint_graph.make_checkpoint import GGUF_NAME, write_side_files
from flint_graph.nano.curriculum import episodes, supervised
from flint_graph.nano.qat import episode_loss, export, fake_quant, parameters, trainable
from flint_graph.tokenizer import FlintTokenizer


def side_files(cfg: FlintConfig, d: Path) -> FlintTokenizer:
    """config.json, tokenizer and generation_config in `d` (written once)."""
    if not (d / "tokenizer.json").is_file():
        d.mkdir(parents=True, exist_ok=True)
        write_side_files(cfg, d, seed=0)
    return FlintTokenizer.from_dir(d)


def load_state(path: Path, cfg: FlintConfig, device: str, lr: float):
    """(master weights, optimiser, step): from `path` when it exists, else fresh."""
    w = trainable(cfg, 0, device)
    opt = torch.optim.AdamW(parameters(w), lr=lr, weight_decay=0.0)
    step = 0
    if path.is_file():
        st = torch.load(path, map_location=device)
        for p, saved in zip(parameters(w), st["params"]):
            p.data.copy_(saved)
        opt.load_state_dict(st["opt"])
        step = st["step"]
    return w, opt, step


def save_state(path: Path, w, opt, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"params": [p.detach().cpu() for p in parameters(w)], "opt": opt.state_dict(),
                "step": step}, tmp)
    tmp.replace(path)  # a run killed mid-save keeps the previous state


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", type=Path, required=True, help="state directory (resumed)")
    ap.add_argument("--preset", default="nano", help="model config (default: nano)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=9.0, help="stop after this wall time")
    ap.add_argument("--steps", type=int, default=10**9, help="stop after this many steps")
    ap.add_argument("--batch", type=int, default=8, help="episodes per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--recall-pairs", type=int, default=40, help="recall list length at step 0")
    ap.add_argument("--recall-max", type=int, default=1500, help="recall list length cap")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--export", type=Path, metavar="CKPT_DIR",
                    help="write the checkpoint (BF16 shards + NVFP4 GGUF) and exit")
    args = ap.parse_args(argv)
    cfg = FlintConfig.preset(args.preset)
    tok = side_files(cfg, args.state / "side")
    state = args.state / "state.pt"
    w, opt, step = load_state(state, cfg, args.device, args.lr)
    if args.export:
        return _export(cfg, w, args.state / "side", args.export)
    t0, end = time.perf_counter(), time.perf_counter() + 60 * args.minutes
    log = (args.state / "loss.jsonl").open("a")
    start = step
    while step - start < args.steps and time.perf_counter() < end:
        pairs = min(args.recall_max, args.recall_pairs + step // 4)
        eps = episodes(step, args.batch, "train", recall_pairs=pairs, recall_questions=16)
        fq = fake_quant(w)
        loss = sum(episode_loss(cfg, fq, *supervised(e, tok)) for e in eps) / len(eps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters(w), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == start + 1:
            rec = {"step": step, "loss": round(loss.item(), 4), "recall_pairs": pairs,
                   "s": round(time.perf_counter() - t0, 1)}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(json.dumps(rec), flush=True)
    save_state(state, w, opt, step)
    print(f"saved {state} at step {step} ({step - start} this run)")
    return 0


def _export(cfg: FlintConfig, w, side: Path, out: Path) -> int:
    import shutil

    from flint_graph.gguf_checkpoint import write_gguf
    from flint_graph.hf_checkpoint import write_safetensors

    out.mkdir(parents=True, exist_ok=True)
    for f in side.iterdir():
        shutil.copy(f, out / f.name)
    weights = export(w)
    write_safetensors(out, cfg, weights, progress=False)
    write_gguf(out / GGUF_NAME, cfg, weights, progress=False)
    print(f"exported {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

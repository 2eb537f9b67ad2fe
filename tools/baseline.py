"""Eager reference baseline at full 40B size (foundation issue, step 5): the slow number later
work is measured against.

On a CUDA machine: write the `full` NVFP4 GGUF with the real generator, load it with the real
loader (repack included), prefill a chat prompt of --prompt-tokens tokens and greedy-decode
--decode-tokens tokens at batch 1 on the plain reference model; then the same with BF16 weights
generated in memory (the 80 GB BF16 set does not fit the device machine's disk). Prints a table
and writes baseline.json / baseline.md into --out.

    python tools/baseline.py --out $OUT --work /tmp/flint-full
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch

from flint_graph.checkpoints.checkpoint import load_checkpoint
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.make_checkpoint import GGUF_NAME, write_checkpoint
from flint_graph.reference import ReferenceModel
from flint_graph.checkpoints.synthetic import make_weights
from flint_graph.chat.tokenizer import FlintTokenizer

GB = 1e9


def prompt_ids(tok: FlintTokenizer, n_tokens: int) -> list[int]:
    """A chat-templated prompt of exactly n_tokens ids (a long user message, cut to length)."""
    from flint_graph.chat.chat_template import render_chat

    para = ("The H200 moves about four terabytes per second, so a decode step that reads two "
            "gigabytes of weights cannot finish in less than half a millisecond. ")
    text = render_chat(tok.chat_template, [{"role": "user", "content": para * 400}])
    ids = tok.encode(text)
    if len(ids) < n_tokens:
        raise SystemExit(f"prompt only {len(ids)} tokens; raise the repeat count")
    return ids[:n_tokens]


def run_model(name: str, cfg: FlintConfig, weights, ids: list[int], n_decode: int) -> dict:
    """Prefill `ids` then greedy-decode n_decode tokens; times in ms (CUDA-synchronised)."""
    model = ReferenceModel(cfg, weights, "cuda")
    seq = model.new_sequence()
    prompt = torch.tensor(ids, device="cuda")
    with torch.inference_mode():
        torch.cuda.synchronize()
        t = time.perf_counter()
        logits = model.prefill(seq, prompt)
        torch.cuda.synchronize()
        prefill_ms = (time.perf_counter() - t) * 1e3
        token = int(logits.argmax())
        step_ms = []
        for _ in range(n_decode):
            t = time.perf_counter()
            logits = model.forward([seq], [torch.tensor([token], device="cuda")])[0][-1]
            token = int(logits.argmax())  # the host needs the id: this syncs every step
            step_ms.append((time.perf_counter() - t) * 1e3)
    return {
        "weights": name,
        "prompt_tokens": len(ids),
        "prefill_ms": round(prefill_ms, 1),
        "prefill_tokens_per_s": round(len(ids) / prefill_ms * 1e3, 1),
        "decode_tokens": n_decode,
        "decode_ms_per_token_median": round(statistics.median(step_ms), 2),
        "decode_ms_per_token_mean": round(statistics.fmean(step_ms), 2),
        "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / GB, 2),
    }


def main() -> None:
    ap = ValueParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="report directory")
    ap.add_argument("--work", type=Path, default=Path("/tmp/flint-full"),
                    help="where the full GGUF checkpoint is written (needs ~24 GB of disk)")
    ap.add_argument("--prompt-tokens", type=int, default=3000, help="prefill length (tokens)")
    ap.add_argument("--decode-tokens", type=int, default=64, help="greedy decode steps")
    ap.add_argument("--skip-bf16", action="store_true", help="NVFP4 only")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the GGUF already in --work instead of writing it again")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("baseline.py needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = FlintConfig.preset("full")
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    if not (args.reuse and (args.work / GGUF_NAME).is_file()):
        shutil.rmtree(args.work, ignore_errors=True)
        t = time.perf_counter()
        summary = write_checkpoint(cfg, args.work, formats=("gguf",), device="cuda",
                                   progress=False)
        report["write"] = {"total_s": round(time.perf_counter() - t, 1),
                           "steps_s": summary["seconds"],
                           "gguf_bytes": summary["files"][GGUF_NAME]}
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    ckpt = load_checkpoint(args.work / GGUF_NAME, device="cuda", progress=False)
    torch.cuda.synchronize()
    report["load"] = {"load_repack_s": round(time.perf_counter() - t, 2),
                      "weights_gb": round(ckpt.weights.nbytes() / GB, 2),
                      "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / GB, 2)}
    tok = FlintTokenizer.from_dir(ckpt.config_dir)
    ids = prompt_ids(tok, args.prompt_tokens)
    report["runs"] = [run_model("nvfp4 (GGUF, dequantised on the fly)", cfg, ckpt.weights, ids,
                                args.decode_tokens)]
    del ckpt
    torch.cuda.empty_cache()
    if not args.skip_bf16:
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        w = make_weights(cfg, 0, "cuda")
        torch.cuda.synchronize()
        report["bf16_make_s"] = round(time.perf_counter() - t, 1)
        report["runs"].append(run_model("bf16 (generated in memory)", cfg, w, ids,
                                        args.decode_tokens))
        del w
    (args.out / "baseline.json").write_text(json.dumps(report, indent=2))
    lines = [f"device: {report['device']}, torch {report['torch']}",
             f"GGUF write: {report.get('write', 'reused')}",
             f"GGUF load+repack: {report['load']}", "",
             "| weights | prompt | prefill ms | prefill tok/s | decode ms/token (median, mean) "
             "| peak GPU GB |", "|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['weights']} | {r['prompt_tokens']} | {r['prefill_ms']} | "
                     f"{r['prefill_tokens_per_s']} | {r['decode_ms_per_token_median']}, "
                     f"{r['decode_ms_per_token_mean']} | {r['peak_gpu_gb']} |")
    (args.out / "baseline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

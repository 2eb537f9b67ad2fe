"""The `flint-graph` command: chat, generate, make-checkpoint.

Each subcommand parses its flags, builds the public API objects and prints. Bad input ends in
one line on stderr and a non-zero exit code, never a traceback (set FLINT_GRAPH_DEBUG=1 to see
one for an unexpected internal error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from flint_graph.errors import FlintError, InvalidRequestError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `flint-graph` console script; returns the exit code."""
    try:
        parser = build_parser()  # imports torch: Ctrl-C may land here too
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_BAD_INPUT
        return args.func(args)
    except FlintError as e:
        print(f"flint-graph: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\nflint-graph: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `flint-graph generate ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug of ours: still one line unless asked for the traceback
        if os.environ.get("FLINT_GRAPH_DEBUG"):
            raise
        print(f"flint-graph: internal error: {type(e).__name__}: {e} "
              "(set FLINT_GRAPH_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand (also used to render `--help`)."""
    from flint_graph import make_checkpoint

    p = argparse.ArgumentParser(
        prog="flint-graph",
        description="Run the Flint 40B MoE LLM: interactive chat, one-shot generation, and "
                    "synthetic checkpoints in the real formats. Without MODEL, the embedded "
                    "default (a tiny synthetic checkpoint, built on first use) is used.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                   help="print the version and exit")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    chat = sub.add_parser("chat", help="interactive terminal chat (streams reasoning, content "
                                       "and tool calls)",
                          description="Chat with a Flint checkpoint in the terminal. Commands: "
                                      "/reset, /save FILE, /reasoning, /help, /exit. Ctrl-C "
                                      "stops the current answer; Ctrl-D or /exit quits.")
    _model_args(chat)
    _sampling_args(chat)
    chat.add_argument("--system", metavar="TEXT", help="system message for the conversation")
    chat.add_argument("--show-reasoning", action="store_true",
                      help="keep reasoning expanded after each answer (default: collapsed to "
                           "one line; /reasoning shows the last one)")
    chat.set_defaults(func=_cmd_chat)

    gen = sub.add_parser("generate", help="one-shot generation for scripts and pipes",
                         description="Generate one answer. The prompt goes through the chat "
                                     "template as one user message unless --raw. Reasoning "
                                     "goes to stderr, the answer to stdout.")
    _model_args(gen)
    gen.add_argument("--prompt", metavar="TEXT",
                     help="prompt text (default: read from stdin)")
    gen.add_argument("--raw", action="store_true",
                     help="send the prompt as raw text, without the chat template")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object: token_ids, text, reasoning_content, "
                          "content, tool_calls, finish_reason, ttft_ms, ms_per_token")
    _sampling_args(gen)
    gen.set_defaults(func=_cmd_generate)

    mk = sub.add_parser("make-checkpoint", help="write a synthetic Flint checkpoint (BF16 "
                                                "safetensors and/or NVFP4 GGUF)",
                        description="Write a seeded synthetic checkpoint in exactly the real "
                                    "formats: DIR/ with config, tokenizer and BF16 shards, "
                                    "and DIR/model-nvfp4.gguf.")
    make_checkpoint.add_arguments(mk)
    mk.set_defaults(func=make_checkpoint.run)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flint-graph")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="BF16 checkpoint directory or NVFP4 .gguf file (default: the embedded "
                        "tiny checkpoint, built into a cache directory on first use)")
    p.add_argument("--hf-config-path", metavar="DIR",
                   help="directory with config.json, tokenizer and generation_config.json for "
                        "a GGUF (default: the GGUF's own directory)")
    p.add_argument("--device", metavar="DEV",
                   help="torch device, e.g. cuda or cpu (default: cuda when available)")
    p.add_argument("--tools", metavar="TOOLS.json", type=Path,
                   help="JSON file with a list of OpenAI-style function tools the model may call")
    p.add_argument("--no-think", dest="enable_thinking", action="store_false",
                   help="turn thinking off (the prompt ends with </think>)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (defaults come from the checkpoint's "
                             "generation_config.json)")
    g.add_argument("--max-tokens", type=int, metavar="N",
                   help="most tokens to generate, reasoning included (default: up to the "
                        "context limit)")
    g.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--top-p", type=float, metavar="P", help="nucleus mass, in (0, 1]")
    g.add_argument("--top-k", type=int, metavar="K", help="keep the K most likely (0 = off)")
    g.add_argument("--seed", type=int, metavar="S", help="seed for reproducible sampling")
    g.add_argument("--stop", action="append", metavar="TEXT", default=None,
                   help="stop string (repeatable); it is not included in the output")


def sampling_params(args: argparse.Namespace):
    """SamplingParams from the sampling flags (unset flags take the checkpoint defaults)."""
    from flint_graph.sampling import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                          stop=list(args.stop or []))


def load_tools(path: Path | None) -> list[dict[str, Any]] | None:
    """Read a tools.json (a JSON list of OpenAI function tools); InvalidRequestError if bad."""
    if path is None:
        return None
    try:
        tools = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(f"{path}: tools file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"{path}: cannot read tools file ({e})") from None
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"{path}: not valid JSON ({e})") from None
    from flint_graph.chat_template import validate_tools

    if not isinstance(tools, list):
        raise InvalidRequestError(f"{path}: expected a JSON list of tools, found "
                                  f"{type(tools).__name__}")
    try:
        validate_tools(tools)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"{path}: {e}") from None
    return tools


def load_llm(args: argparse.Namespace):
    """The LLM for MODEL / --hf-config-path / --device (embedded default without MODEL)."""
    from flint_graph.api import LLM

    if args.model is not None and not Path(args.model).exists():
        raise InvalidRequestError(f"{args.model}: no such checkpoint (expected a BF16 "
                                  "checkpoint directory or an NVFP4 .gguf file)")
    llm = LLM(args.model, hf_config_path=args.hf_config_path, device=args.device)
    if (llm.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ
            and llm.cfg.hidden_size <= SMALL_MODEL_HIDDEN):
        # A small model's matmuls are too short to share between threads: extra OpenMP threads
        # only contend (seen: 4 ms/token on one thread, 100+ ms with a busy second core).
        _set_threads(1)
    return llm


SMALL_MODEL_HIDDEN = 512


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _cmd_generate(args: argparse.Namespace) -> int:
    from flint_graph.api import output_to_json

    prompt = args.prompt
    if prompt is None:
        if sys.stdin.isatty():
            raise InvalidRequestError("no prompt: pass --prompt TEXT or pipe text on stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InvalidRequestError("prompt: expected non-empty text, got an empty prompt")
    tools = load_tools(args.tools)
    if args.raw and (tools or not args.enable_thinking):
        raise InvalidRequestError("--tools and --no-think apply to the chat template; they "
                                  "cannot be used with --raw")
    params = sampling_params(args)
    llm = load_llm(args)
    if args.raw:
        stream = llm.stream(prompt, params)
    else:
        stream = llm.stream_chat([{"role": "user", "content": prompt}], tools, params,
                                 enable_thinking=args.enable_thinking)
    shown_reasoning = False
    for d in stream:
        if args.json:
            continue
        if args.raw:
            sys.stdout.write(d.text)
        else:
            if d.reasoning:
                sys.stderr.write(d.reasoning)
                sys.stderr.flush()
                shown_reasoning = True
            sys.stdout.write(d.content)
            for c in d.tool_calls:
                sys.stdout.write(f"\n[tool call] {c.name} {c.arguments_json()}\n")
        sys.stdout.flush()
    out = stream.output
    if args.json:
        print(output_to_json(out))
        return 0
    if shown_reasoning:
        sys.stderr.write("\n")
    print()
    for err in out.errors:
        print(f"flint-graph: warning: {err}", file=sys.stderr)
    room = llm.cfg.max_position_embeddings - len(out.prompt_token_ids)
    if out.finish_reason == "length" and len(out.token_ids) >= room:
        print(f"flint-graph: note: the context limit ({llm.cfg.max_position_embeddings} tokens) "
              f"ended the answer after {len(out.token_ids)} tokens; shorten the prompt",
              file=sys.stderr)
    elif out.finish_reason == "length" and not args.raw and not out.content \
            and not out.tool_calls:
        print(f"flint-graph: note: max tokens ({len(out.token_ids)}) ran out while the model was "
              "still reasoning; raise --max-tokens for an answer", file=sys.stderr)
    elif shown_reasoning and not out.reasoning_content and out.content:
        print("flint-graph: note: the model stopped without closing its reasoning (</think>), "
              "so that text is reported as the answer", file=sys.stderr)
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    from flint_graph.chat_cli import ChatSession

    tools = load_tools(args.tools)
    params = sampling_params(args)
    llm = load_llm(args)
    return ChatSession(llm, params, tools=tools, system=args.system,
                       enable_thinking=args.enable_thinking,
                       show_reasoning=args.show_reasoning).run()


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`flint-graph` with one graph-engine prefill setting changed, to locate a difference that
`eval --compare` finds (2026-12-03: flint-nano's graph engine 4.3e-3 nats from the reference,
against 2.2e-4 a week of changes before):

    python tools/eval_variant.py MODE eval --engine graph --compare REF.json ...

MODE: mma-attn (attention on attn_prefill, mma.sync, instead of attn_prefill_wg), one-stream
(the prefill's side stream off), no-reuse (EngineConfig.kv_reuse off), none. The rest are
`flint-graph` arguments. Needs a CUDA GPU for the graph engine."""
import sys

MODES = ("mma-attn", "one-stream", "no-reuse", "none")
if len(sys.argv) < 2 or sys.argv[1] not in MODES:
    sys.exit(f"usage: eval_variant.py {{{'|'.join(MODES)}}} FLINT-GRAPH-ARGS...")
mode = sys.argv[1]
from flint_graph.capture import prefill as pf  # noqa: E402

if mode == "mma-attn":
    pf.ATTN_KERNEL = "attn_prefill"
elif mode == "one-stream":
    orig = pf.Prefill.__init__

    def init(self, *a, **kw):
        orig(self, *a, **kw)
        if self.side.on:
            self.set_overlap(False)
    pf.Prefill.__init__ = init
elif mode == "no-reuse":
    from flint_graph.runtime import engine_config as ec
    orig_post = ec.EngineConfig.__post_init__

    def post(self):
        object.__setattr__(self, "kv_reuse", False)
        orig_post(self)
    ec.EngineConfig.__post_init__ = post
from flint_graph.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))

"""The prefill's KV write: a chunk's keys and values into the slot's ring or pages.

For each of the chunk's T rows t and KV head h, k_new[t, h, :] goes to
k_cache[where[t], h, entry[t], :] and v_new[t, h, :] to v_cache[where[t], h, entry[t], :]:
`capture/prefill.py`'s indexed assignment `kv.k[where, :, entry] = k` (what
`Prefill._prepare` computes: ring row or page, and the entry in it; rows a ring does not keep
and padding rows point at the scratch or snapshot slot). A sliding layer's cache is its rings
[slots + 2, HKV, W, D], a full layer's its pages [pages, HKV, KV_PAGE, D]: P is W or KV_PAGE.
Values are copied bit for bit.

Why a kernel: torch's advanced-indexing assignment took 43.5 µs a launch on an H100 for an
8K chunk (98 launches, 4.3 ms of an 8K NVFP4 prefill: docs/perf-log.md, twenty-third session)
to move 8 MB; it computes indices per 2-byte element. Here each thread moves one 16-byte piece
of a 2·D-byte head row, so an 8K chunk's 16 MB of K and V is read once and written once
(~10 µs at copy bandwidth for both, in one launch).

Design: a CTA is TOK rows of the chunk (block (ITEMS, TOK)); thread x of a row moves 16-byte
piece x of the row's 2·HKV·D/8 pieces (K's heads first, then V's). Rows past T do nothing.
Rows that point at the same destination (the scratch slot) race; only scratch entries are
written that way, which nothing reads.

PDL: every argument but the caches is a predecessor's output (k_new and v_new from
qk_norm_rope, where and entry from the chunk's set-up), read only after griddepcontrol.wait,
in every thread; nothing is loaded before it.

Shape legend: T chunk rows (dynamic), NB ring rows or pages (dynamic), HKV KV heads, P
entries per ring row or page, D head dim.

Tolerance (GPU test): bit-exact, every cache entry (those not written keep their NaN).
"""

import torch

from flint_graph.kernels.toolchain.spec import KV_PAGE, KernelDef, Launch, Spec, TensorArg

VEC = 8  # bf16 values per 16-byte piece
MAX_THREADS = 512


def pieces(spec: Spec) -> int:
    """16-byte pieces of one chunk row: K and V, every KV head (raises ValueError when D is not
    a multiple of 8 or a row needs more than MAX_THREADS pieces)."""
    hkv, d = spec["HKV"], spec["D"]
    if d % VEC:
        raise ValueError(f"kv_write: D = {d}; expected a multiple of {VEC}")
    n = 2 * hkv * d // VEC
    if n > MAX_THREADS:
        raise ValueError(f"kv_write: 2·HKV·D/8 = {n} pieces a row; at most {MAX_THREADS}")
    return n


def rows_per_cta(spec: Spec) -> int:
    """Chunk rows a CTA moves (as many as MAX_THREADS threads hold)."""
    return MAX_THREADS // pieces(spec)


def _args(spec: Spec):
    hkv, d, p = spec["HKV"], spec["D"], spec["P"]
    return (TensorArg("k_new", "bf16", ("T", hkv, d), "input"),
            TensorArg("v_new", "bf16", ("T", hkv, d), "input"),
            TensorArg("k_cache", "bf16", ("NB", hkv, p, d), "output"),
            TensorArg("v_cache", "bf16", ("NB", hkv, p, d), "output"),
            TensorArg("where", "i32", ("T",), "input", align=4),
            TensorArg("entry", "i32", ("T",), "input", align=4))


def _launch(spec: Spec) -> Launch:
    tok = rows_per_cta(spec)
    return Launch(grid=(("T", tok), 1, 1), block=(pieces(spec), tok, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation per cache kind the config has: rings (P = sliding_window) and pages
    (P = KV_PAGE)."""
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    kinds = []
    if cfg.num_sliding_layers:
        kinds.append(cfg.sliding_window)
    if cfg.num_full_layers:
        kinds.append(KV_PAGE)
    return [KERNEL.spec(HKV=hkv, D=d, P=p) for p in kinds]


def _reference(spec: Spec, k_new, v_new, k_cache, v_cache, where, entry):
    """(k_cache, v_cache) after the indexed assignment capture/prefill.py made before this
    kernel (copies; the inputs are left alone). Rows with equal destinations keep the last
    row's values in the reference; the kernel's tests give every row its own destination."""
    k, v = k_cache.clone(), v_cache.clone()
    w, e = where.long(), entry.long()
    k[w, :, e] = k_new
    v[w, :, e] = v_new
    return k, v


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int = 77, blocks: int | None = None,
              device: str = "cuda") -> list:
    """k_new, v_new ~ N(0, 1) bf16 [tokens, HKV, D]; caches of `blocks` rows (default: enough
    for every token) poisoned with NaN; `where`, `entry` int32: a random permutation of
    distinct destinations (so the reference's order among rows does not matter)."""
    hkv, d, p = spec["HKV"], spec["D"], spec["P"]
    on = gen.device
    blocks = blocks if blocks is not None else -(-tokens // p) + 1
    if tokens > blocks * p:
        raise ValueError(f"kv_write.make_args: {tokens} tokens do not fit {blocks} × {p} entries")
    dst = torch.randperm(blocks * p, generator=gen, device=on)[:tokens]
    k_new = torch.randn(tokens, hkv, d, generator=gen, device=on).to(torch.bfloat16)
    v_new = torch.randn(tokens, hkv, d, generator=gen, device=on).to(torch.bfloat16)

    def nan():
        return torch.full((blocks, hkv, p, d), float("nan"), dtype=torch.bfloat16, device=on)

    args = [k_new, v_new, nan(), nan(), (dst // p).to(torch.int32), (dst % p).to(torch.int32)]
    return [a.to(device) for a in args]


def bytes_moved(spec: Spec, tokens: int) -> int:
    """Least DRAM bytes of one launch: K and V read and written once, plus where and entry."""
    return tokens * (2 * 2 * 2 * spec["HKV"] * spec["D"] + 8)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64

    from flint_graph.kernels.toolchain import dsl_util as du

    hkv, d, p = spec["HKV"], spec["D"], spec["P"]
    per_head = d // VEC
    per_tensor = hkv * per_head
    tok = rows_per_cta(spec)
    launch = _launch(spec)

    @cute.kernel
    def kv_write_kernel(mk: cute.Tensor, mv: cute.Tensor, mkc: cute.Tensor, mvc: cute.Tensor,
                        mwhere: cute.Tensor, mentry: cute.Tensor):
        x, y, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        cute.arch.griddepcontrol_wait()  # k, v, where and entry are predecessors' outputs
        cute.arch.griddepcontrol_launch_dependents()
        t = Int32(bid) * tok + Int32(y)
        if t < mk.shape[0]:
            is_v = Int32(x) >= per_tensor
            piece = Int32(x) - cutlass.select_(is_v, Int32(per_tensor), Int32(0))
            h = piece // per_head
            c = piece - h * per_head
            blk = Int64(Int32(du.ld_u32(mwhere.iterator.toint() + Int64(t) * 4)))
            ent = Int64(Int32(du.ld_u32(mentry.iterator.toint() + Int64(t) * 4)))
            src_off = ((Int64(t) * hkv + Int64(h)) * d + Int64(c) * VEC) * 2
            dst_off = (((blk * hkv + Int64(h)) * p + ent) * d + Int64(c) * VEC) * 2
            src = cutlass.select_(is_v, mv.iterator.toint(), mk.iterator.toint()) + src_off
            dst = cutlass.select_(is_v, mvc.iterator.toint(), mkc.iterator.toint()) + dst_off
            du.st_v4(dst, du.ld_v4(src))

    @cute.jit
    def kv_write(mk: cute.Tensor, mv: cute.Tensor, mkc: cute.Tensor, mvc: cute.Tensor,
                 mwhere: cute.Tensor, mentry: cute.Tensor, stream: cuda.CUstream):
        kv_write_kernel(mk, mv, mkc, mvc, mwhere, mentry).launch(
            grid=(cute.ceil_div(mk.shape[0], tok), 1, 1), block=list(launch.block),
            stream=stream, use_pdl=True)

    return kv_write


KERNEL = KernelDef(name="kv_write", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))

"""The generation engine: admit requests, prefill, batched decode steps, sample, hand tokens on.

On a CUDA machine with the kernel cache, prompts run through the GPU prefill (`capture/
prefill.py`) and decode steps replay the captured decode graph of the smallest batch bucket that
holds the rows (`capture/runner.py`); elsewhere both run on the plain reference model
(`reference.py`), behind the same `Engine.step()`. Scheduling
follows DESIGN §3 at its simplest: up to `max_slots` sequences; each step admits waiting
requests into free slots, prefills prompt tokens, the prompts with the fewest tokens left first
(while other rows decode only as many as `PrefillPacer` predicts to fit in `prefill_step_ms`, so
running streams keep their pace; with none decoding, up to one chunk), then runs one decode step
over all running rows. New requests queue without waiting for a step (`add`), and a step ends
after at most one chunk of prefill, so a long prompt neither blocks the queue nor delays a
short request or an abort by more than a chunk.
"""

from __future__ import annotations

import logging
import threading
import time
from time import perf_counter as _clock  # the phase marks' clock (the pacer's is time's)
from collections import deque
from collections.abc import Callable

import torch

from flint_graph.checkpoints.checkpoint import LoadedCheckpoint
from flint_graph.runtime.held_signals import signals_held
from flint_graph.runtime.engine_config import (EngineConfig, apply_cpu_threads,
                                               default_prefill_chunk, prefill_threads)
from flint_graph.errors import ConfigError, FlintError
from flint_graph.runtime.prefill_pacer import PrefillPacer
from flint_graph.runtime.prefix_cache import MAX_SNAPSHOTS, PrefixCache, Retained
from flint_graph.runtime.prefix_cache import log as reuse_log
from flint_graph.reference import ReferenceModel, SequenceKV
from flint_graph.runtime.request import Request, RequestDelta
from flint_graph.runtime.sampling import OneRowSampleGraph, greedy, sample


class Engine:
    """Owns the model and the running requests.

    Args:
        ckpt: a loaded checkpoint (config, weights on `device`).
        device: torch device the model runs on.
        tokenizer_vocab: token ids >= this are padding rows of the LM head and are never sampled.
        engine: runtime knobs (max_slots: most sequences decoded together; prefill chunk size;
            cpu_threads, applied here by `apply_cpu_threads`, the one CPU thread policy).
    Every delta a step produces is also queued on its request (`Request.pending`), so several
    consumers can drive one engine without losing each other's tokens.
    """

    def __init__(self, ckpt: LoadedCheckpoint, device: torch.device, tokenizer_vocab: int,
                 engine: EngineConfig):
        self.cfg = ckpt.cfg
        self.device = device
        # the reference engine holds its KV as it grows: max_context only caps a sequence
        # there (a bad-input trial, 2026-12-07: it was ignored off the graph engine)
        self.max_context = engine.max_context
        apply_cpu_threads(engine, device, ckpt.cfg.hidden_size)
        self.model = ReferenceModel(ckpt.cfg, ckpt.weights, device)
        self.runner, self.fallback_reason = self._graph_runner(ckpt, engine, tokenizer_vocab)
        # the graph engine holds at most one KV slot per row of the largest bucket
        self.max_slots = len(self.runner.free_slots) if self.runner else engine.max_slots
        self.prefill_chunk_tokens = default_prefill_chunk(
            engine, self.runner is not None and self.runner.prefill_path == "kernel")
        # prompt tokens prefilled per step, so running streams keep their pace (DESIGN §3)
        self.pacer = PrefillPacer(engine.prefill_step_ms, engine.prefill_tokens_per_step)
        # finished sequences kept for reuse (issue 22): as many as there are slots
        self.prefix_cache = PrefixCache(self.max_slots if engine.kv_reuse else 0)
        self._snapshots: dict[int, dict[int, object]] = {}  # request id -> position -> rings
        # request id -> position of a ring snapshot not yet taken: taken after the first token
        # is out (`_take_snapshots`), so it is not part of the time to first token
        self._snapshot_due: dict[int, int] = {}
        # request id -> its chat preamble's end (Request.snapshot_at): that snapshot is kept
        self._pinned: dict[int, int] = {}
        # rows of a decode step that did not return (Ctrl-C, or any exception the step does
        # not handle): some layers may have written their next position's KV (a ring entry
        # over one the retained ids still claim), so they are never retained (issue 22)
        self._unsettled: set[int] = set()
        # pipelined decode (EngineConfig.pipeline_decode, graph engine): the step launched last
        # and not yet read, as (its rows, capture.runner.PendingStep); `_ahead`: rows whose
        # last output id a launched step fed and whose draw is not yet appended, so their KV
        # (stream-ordered) holds one token more than `_expected_tokens` says: a retirement
        # keeps that token too (the live rings lost the entry a resume before it would need)
        self.pipeline = bool(engine.pipeline_decode and self.runner is not None
                             and hasattr(self.runner, "launch"))
        self._inflight: tuple[list[Request], object] | None = None
        self._ahead: set[int] = set()
        # called as hook(request, prompt tokens prefilled, prompt tokens) after each prefill
        # chunk, in the thread that steps (a progress display: terminal/progress.py); None:
        # prompts prefill in one call per step. An exception it raises ends that request.
        self.prefill_progress: Callable[[Request, int, int], None] | None = None
        self.prefilling: list[Request] = []  # admitted, prompt not yet fully in the KV cache
        self._prefilled: dict[int, int] = {}  # request id -> prompt tokens already prefilled
        self.tokenizer_vocab = tokenizer_vocab
        self._warm_up_sampler()
        # the first token of a prompt drawn by one graph replay, not ~40 eager launches
        self._sample_one = self._one_row_sampler()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._kv: dict[int, SequenceKV] = {}
        self._slot: dict[int, int] = {}
        self._lock = threading.RLock()  # abort / step from several threads
        self._queue_lock = threading.Lock()  # `waiting` alone: add never waits for a step
        self._aborting: set[Request] = set()  # aborts the next step ends (under _queue_lock)

    def _graph_runner(self, ckpt: LoadedCheckpoint, engine: EngineConfig, vocab: int):
        """(GraphRunner or None, why not). Raises ConfigError when engine="graph" cannot run."""
        if engine.engine == "reference":
            return None, "engine=reference"
        why = None
        if self.device.type != "cuda":
            why = f"the graph engine needs CUDA; this run is on {self.device}"
        else:
            try:
                from flint_graph.capture.runner import GraphRunner

                chunk = default_prefill_chunk(engine, engine.prefill == "kernel")
                return GraphRunner(self.cfg, self.model.weights, self.model,
                                   min(engine.max_slots, 8), engine.max_context, vocab,
                                   prefill=engine.prefill,
                                   prefill_chunk=min(chunk, engine.prefill_tokens_per_step
                                                     or chunk),
                                   prefill_graphs=engine.prefill_graphs,
                                   prefill_dense_bf16=engine.prefill_dense_bf16,
                                   attn_fold=engine.decode_attn_fold), None
            except (ImportError, FlintError, ValueError, RuntimeError) as e:
                why = f"{type(e).__name__}: {e}"
        if engine.engine == "graph":
            raise ConfigError(f"engine=graph (--engine graph): {why}")
        return None, why

    @property
    def name(self) -> str:
        """"graph" or "reference": which path runs decode steps."""
        return "graph" if self.runner else "reference"

    @property
    def context_limit(self) -> int:
        """Tokens one sequence may hold (prompt + output): the graph engine's KV capacity per
        slot, else the model's limit capped by EngineConfig.max_context where set."""
        if self.runner:
            return self.runner.context_limit
        most = self.cfg.max_position_embeddings
        return most if self.max_context is None else min(most, self.max_context)

    @property
    def has_work(self) -> bool:
        """True while any request waits for prefill or is being decoded."""
        return bool(self.waiting or self.prefilling or self.running
                    or self._inflight is not None)

    def add(self, req: Request) -> None:
        """Queue `req`; it is prefilled by a later `step()`. Safe from any thread. A request
        already finished (aborted before it was queued: a stream cancelled before its first
        read) is not queued: the engine never runs a finished request. Never waits for a step
        in progress (a long prefill)."""
        with self._queue_lock:
            if not req.is_finished:
                self.waiting.append(req)

    def abort(self, req: Request) -> RequestDelta:
        """Stop `req` now (finish reason "abort") and free its KV cache (slot). Safe from any
        thread; a request still queued ends at once, one being prefilled or decoded after the
        step in progress (at most one prefill chunk), by this call or by the next step,
        whichever takes the engine's lock first; returns once it has ended."""
        with self._queue_lock:
            queued = req in self.waiting
            if queued:
                self.waiting.remove(req)
            else:
                # also for the next step to end: a thread stepping in a loop (a long prompt's
                # prefill, one step after another) releases the lock and takes it again before
                # this waiting thread wakes, so this abort waited for the whole prompt (47 s
                # on the CPU, a server's shutdown; 2026-12-05)
                self._aborting.add(req)
        if queued:
            return req.finish("abort")
        while not self._lock.acquire(timeout=0.05):
            if req.is_finished:  # a step ended it: the caller need not wait for the lock
                with self._queue_lock:
                    self._aborting.discard(req)
                return req.finish("abort")
        try:
            with self._queue_lock:
                self._aborting.discard(req)
            self._retire(req)  # (a no-op where a step ended it first)
            return req.finish("abort")
        finally:
            self._lock.release()

    def step(self) -> list[RequestDelta]:
        """Admit waiting requests into free slots, run the prefill budget of `PrefillPacer` (oldest
        request first; a request whose prompt completes samples its
        first token), then one decode step over the running rows; returns every delta.
        Threads calling it take turns (one step at a time); every delta is also queued on its
        request, so each consumer reads its own."""
        with self._lock:
            return self._step()

    @torch.inference_mode()
    def _step(self) -> list[RequestDelta]:
        deltas: list[RequestDelta] = []
        with self._queue_lock:
            aborting, self._aborting = self._aborting, set()
        for req in aborting:  # `abort` calls still waiting for the lock (see there)
            self._retire(req)
            deltas.append(req.finish("abort"))
        if self._inflight is not None:
            if self._decode_only():  # the next step launches before these tokens are handled
                deltas += self._collect(launch_next=True)
                for r in [r for r in self.running if r.is_finished]:
                    self._retire(r)
                return deltas
            deltas += self._collect(launch_next=False)  # then this step as without pipelining
        self._take_snapshots()  # before anything this step writes can reach a ring
        admitted: list[Request] = []
        while len(self.running) + len(self.prefilling) < self.max_slots:
            with signals_held():  # popped and admitted whole, or left queued (held_signals.py)
                with self._queue_lock:
                    req = self.waiting.popleft() if self.waiting else None
                if req is None:
                    break
                if not req.is_finished:  # an abort may finish it between add and here
                    self._admit(req)
        # while rows decode, a step prefills what fits in its time budget (PrefillPacer)
        # the prompts with the fewest tokens left first: a short request is not queued behind
        # a long prompt's remaining chunks (each step takes at most one chunk of them)
        order = sorted(self.prefilling,
                       key=lambda r: len(r.prompt_ids) - self._prefilled[r.id])
        # (asked only when something prefills: a decode-only step needs no budget)
        budget = self.pacer.budget(decoding=bool(self.running), start=self._prefilled[
            order[0].id], chunk=self.prefill_chunk_tokens) if order else None
        for req in order:
            done = self._prefilled[req.id]
            n = len(req.prompt_ids) - done if budget is None else min(
                budget, len(req.prompt_ids) - done)
            if n <= 0:
                break
            at = self._snapshot_point(req)
            # inside this part: the rings as they stand there are saved during it (no chunk
            # boundary there, which would cost one more pass over the weights)
            inside = at if at is not None and done < at < done + n else None
            req.marks.setdefault("prefill", _clock())
            t0 = time.perf_counter()
            try:
                logits = self._prefill_part(req, done, n, snapshot_at=inside)
                if inside is not None:
                    self._keep_snapshot(req.id, inside, self._save_rings_evicting(
                        req.id, chunk_snapshot=True))
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)  # the pacer times the GPU's work
            except Exception as e:  # noqa: BLE001 - any failure ends this request only
                # this request ends; the others (and later requests) go on
                deltas.append(self._fail(req, f"prefill failed: {type(e).__name__}: {e}"))
                self._retire(req)
                budget = None if budget is None else budget - n
                continue
            except BaseException:
                # Ctrl-C (or a thread's exit) mid-chunk, maybe meant for another request: some
                # layers wrote this chunk, others did not, and a ring may have lost entries the
                # chunk's later queries need. The request goes on, prefilled again from its
                # first token at its next step (it never gets a half-written cache).
                self._restart_prefill(req)
                raise
            self.pacer.observe(n, (time.perf_counter() - t0) * 1e3, start=done)
            req.marks["prefilled"] = _clock()
            self._prefilled[req.id] = done = done + n
            budget = None if budget is None else budget - n
            if done == at:  # the part ended there: the slot's rings are the snapshot
                self._snapshot_due[req.id] = done
            if done == len(req.prompt_ids):
                self.prefilling.remove(req)
                del self._prefilled[req.id]
                if self.prefix_cache.capacity:  # where the next chat turn will diverge
                    self._snapshot_due[req.id] = done
                self.running.append(req)
                admitted.append(req)
                try:
                    deltas += self._sample_and_append([req], logits[None])
                except BaseException:
                    if req.num_generated == 0:  # Ctrl-C before its first token: a decode
                        self.running.remove(req)  # step would find no token to feed, so
                        self.prefilling.append(req)  # it is prefilled again instead
                        self._restart_prefill(req)
                    raise
        # Rows admitted this step already got their first token from prefill.
        rows = [r for r in self.running if not r.is_finished and r not in admitted]
        self._unsettled.update(r.id for r in rows)
        try:
            if rows and self.pipeline:  # its tokens are handled by the next step
                self._inflight = (rows, self.runner.launch(
                    [self._row(r, r.output_ids[-1], r.num_generated) for r in rows]))
                self._ahead.update(r.id for r in rows)  # each feeds its last output id
            else:
                deltas += self._decode(rows) if rows else []
            # a completed step rewrote every row's position (the same token, the same KV)
            self._unsettled.difference_update(r.id for r in rows)
        except (FlintError, ValueError, RuntimeError) as e:
            # Reported to the requests of this step only; the engine takes new ones. A CUDA
            # fault that poisons the context cannot be survived in-process, but it is reported
            # the same way rather than crashing the caller's loop.
            deltas += self._step_failed(rows, e)
        for r in [r for r in self.running if r.is_finished]:
            self._retire(r)
        return deltas

    def _snapshot_point(self, req: Request) -> int | None:
        """Where `req`'s prefill saves its rings on the way (`Request.snapshot_at`, the end of
        a chat's preamble), or None: only with reuse on, a point this prefill has still to
        pass, at least two tokens before the prompt's end (the end's own snapshot serves those)
        and not saved already (a resumed request inherits the snapshot)."""
        at = req.snapshot_at
        if (not self.prefix_cache.capacity or at is None or at <= req.cached_tokens
                or at >= len(req.prompt_ids) - 1 or at in self._snapshots.get(req.id, ())):
            return None
        return at

    def _restart_prefill(self, req: Request) -> None:
        """Start `req`'s prefill over from position 0 with a fresh cache: its reused prefix,
        snapshots and every chunk written so far are forgotten (the graph engine's slot is
        rewritten in order from position 0; the reference engine gets a new sequence)."""
        if not self.runner and req.id in self._kv:
            self._kv[req.id] = self.model.new_sequence()
        self._prefilled[req.id] = 0
        req.cached_tokens = 0
        self._snapshots.pop(req.id, None)
        self._snapshot_due.pop(req.id, None)

    def _prefill_part(self, req: Request, done: int, n: int,
                      snapshot_at: int | None = None) -> torch.Tensor:
        """Prefill prompt tokens done … done+n−1 of `req`; float32 logits [V] of the last. With
        a `prefill_progress` hook, in pieces of one chunk, calling it after each (the chunks
        the model would cut anyway, so nothing else changes). `snapshot_at` (done < it < done
        + n): the rings as they stand there are kept for `_save_rings(chunk_snapshot=True)`."""
        hook = self.prefill_progress
        chunk = self.prefill_chunk_tokens
        piece = chunk if hook else n
        total = len(req.prompt_ids)
        # a display can show the prompt before its first chunk ends (the request's first call:
        # since a step takes at most one chunk, a long prompt's later chunks are later calls)
        if hook and done == req.cached_tokens and total - done > piece:
            self._report(hook, req, done, total)
        logits = None
        for b in range(done, done + n, piece):
            m = min(piece, done + n - b)
            part = torch.tensor(req.prompt_ids[b:b + m], dtype=torch.long, device=self.device)
            at = snapshot_at if snapshot_at is not None and b <= snapshot_at < b + m else None
            if self.runner:
                logits = self.runner.prefill(self._slot[req.id], part, chunk, start=b,
                                             snapshot_at=at)
            else:
                seq = self._kv[req.id]
                seq.snapshot_at = at
                try:
                    # threads by the size of one forward (a chunk), not of the whole prompt
                    with prefill_threads(self.device, min(m, chunk)):
                        logits = self.model.prefill(seq, part, chunk)
                finally:
                    seq.snapshot_at = None
            if hook:
                self._report(hook, req, b + m, total)
        return logits

    @staticmethod
    def _report(hook, req: Request, done: int, total: int) -> None:
        """Call the prefill_progress hook; its failure is named as its own."""
        try:
            hook(req, done, total)
        except Exception as e:  # noqa: BLE001 - reported as the request's error by _step
            raise RuntimeError(f"the prefill_progress hook raised {type(e).__name__}: {e}") \
                from e

    def _decode(self, rows: list[Request]) -> list[RequestDelta]:
        if self.runner:
            return self._graph_decode(rows)
        seqs = [self._kv[r.id] for r in rows]
        for r, seq in zip(rows, seqs):
            # a no-op unless the row's last step did not return (Ctrl-C between its forward
            # and its token's append): then the KV counts a token its ids do not, redone here
            seq.num_tokens = self._expected_tokens(r)
        last = [torch.tensor([r.output_ids[-1]], device=self.device) for r in rows]
        logits = torch.stack([lg[-1] for lg in self.model.forward(seqs, last)])
        return self._sample_and_append(rows, logits)

    @staticmethod
    def _fail(req: Request, why: str) -> RequestDelta:
        req.errors.append(why)
        delta = req.finish("error")
        delta.errors.append(why)
        return delta

    def _step_failed(self, rows: list[Request], e: Exception) -> list[RequestDelta]:
        """End `rows` with "error" for a decode step that raised `e` (the same words whether
        its launch, its replay or its read failed)."""
        return [self._fail(r, f"decode step failed: {type(e).__name__}: {e}") for r in rows]

    def _origin(self, req: Request) -> str | None:
        """Where NaN/inf first appears in this request's activations, found on the error path
        by rerunning its tokens on the reference model with a check after each block
        (`ReferenceModel.first_non_finite`, e.g. "layer 3 (MoE)"). On the graph engine the
        reference model holds the same weights, so a rerun that stays finite returns
        KERNEL_FAULT: the weights are fine and the graph engine's kernels made the NaN. None
        past DIAGNOSE_TOKENS tokens (the rerun would cost about a prefill of the reference
        model, while the engine waits) or when the rerun itself fails."""
        ids = list(req.prompt_ids) + list(req.output_ids)
        if len(ids) > DIAGNOSE_TOKENS[self.device.type == "cuda"]:
            return None
        try:
            where = self.model.first_non_finite(torch.tensor(ids, dtype=torch.long))
        except (FlintError, torch.OutOfMemoryError):
            return None
        return where if where is not None or self.runner is None else KERNEL_FAULT

    def _row(self, r: Request, token: int, generated: int):
        """The decode-graph row feeding `token` as `r`'s `generated`-th output id."""
        global _Row
        if _Row is None:  # (an import inside the per-row call cost ~2 µs a row)
            from flint_graph.capture.decode_step import Row as _Row
        p = r.params
        return _Row(self._slot[r.id], token, len(r.prompt_ids) + generated - 1, p.temperature,
                    p.top_k, p.top_p, r.seed, generated)

    def _graph_decode(self, rows: list[Request]) -> list[RequestDelta]:
        """One graph replay for `rows`, its tokens appended (`_graph_decode_deltas`)."""
        ids, logits = self.runner.decode(
            [self._row(r, r.output_ids[-1], r.num_generated) for r in rows])
        return self._graph_decode_deltas(rows, ids, logits)

    def _graph_decode_deltas(self, rows: list[Request], ids: list[int],
                             logits: torch.Tensor) -> list[RequestDelta]:
        failed, rows, tokens = self._graph_tokens(rows, ids, logits)
        return failed + [r.append(t) for r, t in zip(rows, tokens)]

    def _graph_tokens(self, rows: list[Request], ids: list[int], logits: torch.Tensor
                      ) -> tuple[list[RequestDelta], list[Request], list[int]]:
        """A graph step's draws made tokens, not yet appended: (deltas of rows that ended,
        the other rows, their tokens). Rows whose logits are not finite end with "error"
        (`non_finite_rows`); rows whose stop ids are still banned (min_tokens) are resampled
        from the step's logits; the rest take the graph's draw (steered: `Request.steer`).
        Reads `logits` (float [len(rows), V] on the device): call it before the bucket's
        next launch."""
        bad = non_finite_rows(ids, logits, self.tokenizer_vocab)
        failed = [self._fail(rows[i], _not_finite(rows[i], self._origin(rows[i]))) for i in bad]
        if bad:
            keep = [i for i in range(len(rows)) if i not in bad]
            rows, ids, logits = [rows[i] for i in keep], [ids[i] for i in keep], logits[keep]
        if not rows:
            return failed, [], []
        banned = [i for i, r in enumerate(rows)
                  if r.num_generated < r.params.min_tokens and r.eos_ids]
        tokens = [t if i in banned else rows[i].steer(t) for i, t in enumerate(ids)]
        if any(r.params.logprobs for r in rows):  # off the decode hot path unless asked
            drawn = [i for i in range(len(rows)) if i not in banned]
            _record_logprobs([rows[i] for i in drawn], logits[drawn], [tokens[i] for i in drawn])
        if banned:
            f, brows, btoks = self._sample_tokens([rows[i] for i in banned],
                                                  logits[banned].clone())
            failed += f
            redrawn = dict(zip((r.id for r in brows), btoks))
            keep = [i for i, r in enumerate(rows) if i not in banned or r.id in redrawn]
            tokens = [redrawn.get(rows[i].id, tokens[i]) for i in keep]
            rows = [rows[i] for i in keep]
        return failed, rows, tokens

    def _decode_only(self) -> bool:
        """Whether this step is the in-flight step's rows decoding once more and nothing else
        (no prompt to prefill or admit, no ring snapshot due, every running row in it): then
        the next step is launched before the in-flight one's tokens are handled."""
        if self.prefilling or self._snapshot_due:
            return False
        if self.waiting and len(self.running) < self.max_slots:
            return False
        inflight = {r.id for r in self._inflight[0]}
        return all(r.id in inflight for r in self.running if not r.is_finished)

    def _collect(self, launch_next: bool) -> list[RequestDelta]:
        """Read the in-flight step and append its tokens; with `launch_next`, first launch the
        next step for the rows these tokens do not end (EOS, stop ids, max_tokens: the
        checks `Request.append` makes before any text), so the GPU computes it while the host
        detokenizes. A row that the text then ends (a stop string, the output parser) was fed
        one token too many: its KV holds it (`_ahead`, kept if it is retained) and the next
        read drops its draw. A launch that fails ends its rows with "error" after their
        tokens are appended (as a failed step does without pipelining)."""
        rows, pending = self._inflight
        self._inflight = None
        live = [i for i, r in enumerate(rows) if not r.is_finished]  # aborted ones are gone
        rows = [rows[i] for i in live]
        try:
            ids, logits = pending.result()
        except (FlintError, ValueError, RuntimeError) as e:
            return self._step_failed(rows, e)
        if len(live) < len(ids):
            ids, logits = [ids[i] for i in live], logits[live]
        failed, rows, tokens = self._graph_tokens(rows, ids, logits)
        nxt = [(r, t) for r, t in zip(rows, tokens) if launch_next and not r.ends_with(t)]
        launch_error = None
        if nxt:
            # until its tokens are appended the KV of these rows is two ahead of their ids
            self._unsettled.update(r.id for r, _ in nxt)
            try:
                pending = self.runner.launch([self._row(r, t, r.num_generated + 1)
                                              for r, t in nxt])
            except (FlintError, ValueError, RuntimeError) as e:
                launch_error = (e, [r for r, _ in nxt])
                self._unsettled.difference_update(r.id for r, _ in nxt)
                nxt = []
            else:
                self._inflight = ([r for r, _ in nxt], pending)
        before = [r.num_generated for r in rows]
        deltas = []
        try:
            for r, t in zip(rows, tokens):
                deltas.append(r.append(t))
                self._ahead.discard(r.id)  # its KV now holds exactly its ids but the last
        except BaseException:
            # Ctrl-C mid-way: the launched step already feeds every token; the rows left
            # take theirs too, or their ids would miss one their KV holds
            for r, t, n in zip(rows, tokens, before):
                if r.num_generated == n:
                    r.append(t)
                    self._ahead.discard(r.id)
            raise
        finally:
            if nxt:
                self._unsettled.difference_update(r.id for r, _ in nxt)
                self._ahead.update(r.id for r, _ in nxt)
        if launch_error is not None:
            e, gone = launch_error
            failed += self._step_failed([r for r in gone if not r.is_finished], e)
        return failed + deltas

    def _one_row_sampler(self) -> OneRowSampleGraph | None:
        """`sample` for one row as a CUDA graph (graph engine only), or None: off CUDA, on the
        reference engine (its decode samples batches eagerly anyway), or when the capture
        fails (the eager `sample` then serves, as before)."""
        if self.runner is None or self.device.type != "cuda":
            return None
        try:
            return OneRowSampleGraph(self.cfg.vocab_size, self.device)
        except RuntimeError:
            return None

    def _warm_up_sampler(self) -> None:
        """Draw once from dummy logits: CUDA loads the sampler's kernels on their first use
        (tens of ms the first request would otherwise wait for its first token)."""
        dev = self.device
        logits = torch.zeros(1, self.cfg.vocab_size, device=dev)
        logits[:, self.tokenizer_vocab:] = float("-inf")
        sample(logits, temperature=torch.ones(1, device=dev),
               top_k=torch.zeros(1, dtype=torch.long, device=dev),
               top_p=torch.ones(1, device=dev), seeds=torch.zeros(1, dtype=torch.long, device=dev),
               positions=torch.zeros(1, dtype=torch.long, device=dev)).tolist()

    def _sample_and_append(self, rows: list[Request], logits: torch.Tensor) -> list[RequestDelta]:
        failed, rows, ids = self._sample_tokens(rows, logits)
        return failed + [r.append(t) for r, t in zip(rows, ids)]

    def _sample_tokens(self, rows: list[Request], logits: torch.Tensor
                       ) -> tuple[list[RequestDelta], list[Request], list[int]]:
        """Draw each row's next token from `logits` (float [len(rows), V]) on the host's
        terms (min_tokens bans, steering, logprobs recorded): (deltas of rows whose logits
        are not finite, ended with "error"; the other rows; their tokens, not appended)."""
        logits = logits.float()
        # whether each row's logits are finite, read with the drawn ids in one transfer (one
        # host sync per call: the first token of a prompt waits for nothing else); over the
        # tokenizer's ids only: a decode graph's logits (the min_tokens resample) hold -inf in
        # the LM head's padding rows
        finite_dev = torch.isfinite(logits[:, :self.tokenizer_vocab]).all(dim=-1)
        logits[:, self.tokenizer_vocab:] = float("-inf")
        unbanned = logits.clone() if any(r.params.logprobs for r in rows) else logits
        for i, r in enumerate(rows):
            # Before min_tokens no stop id may be drawn (ignore_eos already left EOS out).
            if r.num_generated < r.params.min_tokens and r.eos_ids:
                logits[i, r.eos_ids] = float("-inf")
        dev = logits.device
        # all greedy (chat defaults, evals): an argmax, not sample's sort of [B, V] (the first
        # token of every greedy request on the graph engine, every step on the reference one).
        # A row of NaN logits draws a meaningless id here (no op of these asserts on NaN); it
        # is discarded below.
        if all(r.params.temperature == 0 for r in rows):
            drawn = greedy(logits)
        elif (len(rows) == 1 and self._sample_one is not None
              and logits.shape[-1] == self._sample_one.vocab):
            r = rows[0]
            drawn = self._sample_one.draw(logits[0], r.params, r.seed, r.num_generated)
        else:
            drawn = sample(
                logits,
                temperature=torch.tensor([r.params.temperature for r in rows], device=dev),
                top_k=torch.tensor([r.params.top_k for r in rows], device=dev,
                                   dtype=torch.long),
                top_p=torch.tensor([r.params.top_p for r in rows], device=dev),
                seeds=torch.tensor([r.seed for r in rows], device=dev, dtype=torch.long),
                positions=torch.tensor([r.num_generated for r in rows], device=dev,
                                       dtype=torch.long),
            )
        ids, finite = torch.stack([drawn.long(), finite_dev.long()]).tolist()
        if not all(finite):
            # NaN or inf logits would sample id 0 forever ("!!", finish "length", no error):
            # end those requests with the reason instead (weights or settings out of range)
            failed = [self._fail(r, _not_finite(r, self._origin(r)))
                      for r, ok in zip(rows, finite) if not ok]
            keep = [i for i, ok in enumerate(finite) if ok]
            rows = [rows[i] for i in keep]
            ids = [ids[i] for i in keep]
            unbanned = unbanned[keep]
            if not rows:
                return failed, [], []
        else:
            failed = []
        ids = [r.steer(t) for r, t in zip(rows, ids)]  # a forced tool call (Request.force)
        _record_logprobs(rows, unbanned, ids)
        return failed, rows, ids

    # -- KV reuse (flint_graph/runtime/prefix_cache.py) ---------------------------------------------

    def drop_retained(self) -> int:
        """Forget every retained sequence (their KV slots go back); returns how many. Safe
        from any thread."""
        with self._lock:
            gone = self.prefix_cache.clear()
            for e in gone:
                if self.runner:
                    self.runner.free_slot(e.kv)
            return len(gone)

    def _admit(self, req: Request) -> None:
        """Give `req` a KV cache: the retained sequence sharing the longest usable prefix with
        its prompt (prefill resumes after it: req.cached_tokens), else a fresh one."""
        req.marks["admit"] = _clock()
        m = self.prefix_cache.take(req.prompt_ids) if self.prefix_cache.capacity else None
        if m is not None and m.fork and not self._fork(req, m):
            m.fork = False  # no room for a copy: the request continues in the entry's KV
        if m is None:
            if self.runner:
                self._slot[req.id] = self._alloc_slot()
            else:
                self._kv[req.id] = self.model.new_sequence()
            self._prefilled[req.id] = 0
        else:
            if not m.fork:  # it continues in the entry's KV (a fork has `_fork`'s copy)
                if self.runner:
                    self._slot[req.id] = m.entry.kv
                else:
                    self._kv[req.id] = m.entry.kv
                    m.entry.kv.num_tokens = m.reuse
            if m.snapshot is not None:
                self._load_rings(req, m.entry.snapshots[m.snapshot])
            # rings saved at or before the resume point still describe this sequence
            self._snapshots[req.id] = {p: r for p, r in m.entry.snapshots.items()
                                       if p <= m.reuse}
            self._prefilled[req.id] = m.reuse
            req.cached_tokens = m.reuse
        if req.snapshot_at is not None:
            self._pinned[req.id] = req.snapshot_at
        self.prefilling.append(req)
        req.marks["admitted"] = _clock()

    def _fork(self, req: Request, m) -> bool:
        """Give `req` a KV holding a copy of `m.entry`'s first `m.reuse` positions (the full
        layers'; the rings come from the snapshot `_admit` loads) and put the entry back in
        the cache (a new conversation sharing another's chat preamble, `Match.fork`). False,
        with nothing changed, when there is no room for the copy (no graph-engine slot free
        even after evicting the other retained sequences, or no memory)."""
        if self.runner:
            try:
                slot = self._alloc_slot()  # the entry is out of the cache: never evicted here
            except RuntimeError:
                return False
            self.runner.copy_prefix(m.entry.kv, slot, m.reuse)
            self._slot[req.id] = slot
        else:
            try:
                self._kv[req.id] = m.entry.kv.prefix_copy(m.reuse)
            except torch.OutOfMemoryError:
                return False
        for e in self.prefix_cache.add(m.entry):  # back as it was (nothing grew: no eviction)
            if self.runner:
                self.runner.free_slot(e.kv)
        return True

    def _alloc_slot(self) -> int:
        """A free graph-engine slot, evicting the least recently used retained sequence when
        none is free."""
        if not self.runner.free_slots:
            victim = self.prefix_cache.evict()
            if victim is not None:
                self.runner.free_slot(victim.kv)
        return self.runner.alloc_slot()

    def _preamble(self, rid: int, snaps: dict) -> int | None:
        """Request `rid`'s chat preamble snapshot position (`Retained.preamble`), where it was
        saved; None otherwise."""
        at = self._pinned.get(rid)
        return at if at in snaps else None

    def _take_snapshots(self, req: Request | None = None) -> None:
        """Take the ring snapshots due (of `req` only, or of every request): the rings as the
        prompt's prefill left them. Deferred from the prefill's end to the next step (or the
        request's retirement) so that the first token does not wait for the copy (~0.3 ms of
        a 25-token prompt's TTFT on the H200, tools/ttft_breakdown.py); nothing writes a
        request's rings between its first token and its next step."""
        for rid in [req.id] if req is not None else list(self._snapshot_due):
            pos = self._snapshot_due.pop(rid, None)
            if pos is None or rid not in self._slot and rid not in self._kv:
                continue
            self._keep_snapshot(rid, pos, self._save_rings_evicting(rid))

    def _keep_snapshot(self, rid: int, pos: int, rings) -> None:
        """Keep `rings` (`_save_rings`' form, or None when no memory was left for the copy) as
        request `rid`'s resume point at `pos`, dropping its oldest beyond MAX_SNAPSHOTS."""
        if rings is None:  # no memory even with nothing retained: this resume point is lost
            reuse_log.debug("request %s: no memory for the ring snapshot at %d", rid, pos)
            return
        snaps = self._snapshots.setdefault(rid, {})
        snaps[pos] = rings
        # the oldest go first, but never the chat preamble's (every later turn and a new
        # conversation with the same tools resume there)
        pinned = self._pinned.get(rid)
        older = sorted(p for p in snaps if p != pinned)
        for old_pos in older[:max(0, len(snaps) - MAX_SNAPSHOTS)]:
            del snaps[old_pos]

    def _save_rings_evicting(self, rid: int, chunk_snapshot: bool = False):
        """`_save_rings(rid, chunk_snapshot)`, evicting retained sequences (least recently
        used first, with their snapshots) while the copy runs out of memory; None when it
        still does with none left. A snapshot only saves work later (a resume without one
        prefills from the start), so memory pressure never fails the request that takes it
        (issue 22)."""
        while True:
            try:
                return self._save_rings(rid, chunk_snapshot)
            except torch.OutOfMemoryError:
                reuse_log.debug("request %s: out of memory for a ring snapshot; evicting", rid)
                victim = self.prefix_cache.evict()
                if victim is None:
                    return None
                if self.runner:
                    self.runner.free_slot(victim.kv)
                victim.snapshots.clear()
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

    def _save_rings(self, rid: int, chunk_snapshot: bool = False):
        """A copy of request `rid`'s sliding-window rings (the reference's per-layer K/V rings,
        or the graph engine's slot rows); with `chunk_snapshot`, of the rings its last prefill
        part saved on the way (`_prefill_part`'s snapshot_at)."""
        if chunk_snapshot:
            if self.runner:
                return self.runner.snapshot_rings()
            seq = self._kv[rid]
            rings, seq.snapshot = seq.snapshot, [None] * len(seq.snapshot)
            return rings
        if self.runner:
            return self.runner.save_rings(self._slot[rid])
        seq = self._kv[rid]
        return [(k.clone(), v.clone()) if w else None
                for k, v, w in zip(seq.k, seq.v, seq.windows)]

    def _load_rings(self, req: Request, rings) -> None:
        if self.runner:
            self.runner.load_rings(self._slot[req.id], rings)
            return
        seq = self._kv[req.id]
        for i, saved in enumerate(rings):
            if saved is not None:
                seq.k[i].copy_(saved[0])
                seq.v[i].copy_(saved[1])

    def _cached_tokens(self, req: Request) -> int:
        """Tokens whose KV `req`'s cache holds: the prompt and every output token but the
        last (sampled, never fed back)."""
        if not self.runner:
            return self._kv[req.id].num_tokens
        # a pipelined step in flight feeds its last output id (`_collect`)
        return self._expected_tokens(req) + (req.id in self._ahead)

    @staticmethod
    def _expected_tokens(req: Request) -> int:
        """The tokens a decoding request's KV should hold: its prompt and every output token
        but the last. The graph engine writes each step at this position; the reference
        engine's sequence counts what its forward stored, reset to this after a step that
        did not return (Ctrl-C between its forward and the token's append)."""
        return len(req.prompt_ids) + max(0, req.num_generated - 1)

    def _retire(self, req: Request) -> None:
        """`_retire_now` with Ctrl-C and SIGTERM held: retired whole (held_signals.py)."""
        with signals_held():
            self._retire_now(req)

    def _retire_now(self, req: Request) -> None:
        """Drop `req` from the engine. Its KV is retained for reuse when its prompt was fully
        prefilled and nothing failed (finish stop / length / abort after the prefill), and
        the prompt's finished chunks when it was aborted between prefill steps; a request
        that failed leaves nothing reusable (nor does a chunk cut by Ctrl-C:
        `_restart_prefill` forgot it already). One whose decode step did not return (Ctrl-C
        mid-step, the chat's way to stop a reply) keeps the positions before the step's and
        the snapshots already saved, but not its live rings' spare entry, which the step may
        have overwritten (`Retained.live_back` 0)."""
        keep = (self.prefix_cache.capacity and req in self.running and req.finish_reason in
                (None, "stop", "length", "repeat", "abort", "tool_calls") and not req.errors)
        # Ctrl-C mid-step: every position below the step's is whole, the step's own (and in
        # some layers the ring entry it replaces) may be half-written or still being written
        # (stream-ordered before anything a later request queues). Dropping it all cost the
        # next chat turn its whole history (a new user's trial, 2026-12-07: TTFT 711 ms, none
        # of 568 prompt tokens cached, against 30-100 ms a turn before).
        cut = req.id in self._unsettled
        # Aborted mid-prefill (a client that left or timed out, between steps): the chunks
        # done are whole (a chunk cut by Ctrl-C restarts the prefill, `_restart_prefill`), so
        # that prefix is kept, and the same prompt sent again resumes there instead of from 0.
        # Only after a chunk of its own: until then a resumed request's live rings may be those
        # of the snapshot it resumed one token before, a position past its cached tokens.
        partial = (self.prefix_cache.capacity and req in self.prefilling and not req.errors
                   and req.finish_reason in (None, "abort")
                   and self._prefilled.get(req.id, 0) > req.cached_tokens)
        if (self.prefix_cache.capacity and reuse_log.isEnabledFor(logging.DEBUG) and not keep
                and not partial):
            reuse_log.debug("request %s not retained (finish %s, errors %d, running %s, "
                            "unsettled %s)", req.id, req.finish_reason, len(req.errors),
                            req in self.running, req.id in self._unsettled)
        self._unsettled.discard(req.id)
        if keep:
            if cut:  # a snapshot still due would copy rings the cut step may have written
                self._snapshot_due.pop(req.id, None)
                # n: the position the cut step writes. The reference engine writes each step
                # at the ids' count (it resets its count before a step); a graph step in
                # flight where `_cached_tokens` says, one further when the step before it
                # was read but its token not yet appended (`_ahead`): there the cut step
                # writes n over ring entry n − 513, which a resume at n − 1 would read
                n = self._cached_tokens(req) if self.runner else self._expected_tokens(req)
            else:
                self._take_snapshots(req)
                n = self._cached_tokens(req)
            ids = (req.prompt_ids + req.output_ids)[:n]
            kv = self._slot[req.id] if self.runner else self._kv[req.id]
            snaps = {q: r for q, r in self._snapshots.get(req.id, {}).items() if q <= n}
            reuse_log.debug("request %s retained%s: %d ids, snapshots %s", req.id,
                            " after a cut decode step" if cut else "", len(ids), sorted(snaps))
            evicted = self.prefix_cache.add(Retained(ids, kv, snaps, live_back=0 if cut else 1,
                                                     preamble=self._preamble(req.id, snaps)))
        elif partial:
            self._take_snapshots(req)  # rings due at its next step (a part that ended there)
            n = self._prefilled[req.id]
            kv = self._slot[req.id] if self.runner else self._kv[req.id]
            snaps = {q: r for q, r in self._snapshots.get(req.id, {}).items() if q <= n}
            reuse_log.debug("request %s retained after an abort mid-prefill: %d ids, "
                            "snapshots %s", req.id, n, sorted(snaps))
            evicted = self.prefix_cache.add(Retained(req.prompt_ids[:n], kv, snaps,
                                                     preamble=self._preamble(req.id, snaps)))
            keep = True
        else:
            evicted = []
        if req in self.running:
            self.running.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)
            self._prefilled.pop(req.id, None)
        self._snapshots.pop(req.id, None)
        self._snapshot_due.pop(req.id, None)
        self._pinned.pop(req.id, None)
        self._ahead.discard(req.id)
        kv = self._kv.pop(req.id, None)
        slot = self._slot.pop(req.id, None)
        if not keep and slot is not None:
            self.runner.free_slot(slot)
        for e in evicted:
            if self.runner:
                self.runner.free_slot(e.kv)


# capture.decode_step.Row, imported on the graph engine's first decode step (the reference
# engine never loads the capture package)
_Row = None


# the longest token list `_origin` reruns to name where NaN started (about a prefill's cost,
# while the engine waits): on the CPU, and on CUDA, where the reference model dequantises
# NVFP4 op by op (an 8K-token rerun of the 40B model would take ~45 s)
DIAGNOSE_TOKENS = (8192, 1024)


# `Engine._origin` on the graph engine when the reference model's rerun stays finite
KERNEL_FAULT = "kernel fault"


def _not_finite(req: Request, origin: str | None = None) -> str:
    """The error of a request whose logits are not finite; `origin` (`Engine._origin`: where
    the reference model's rerun first turns non-finite, e.g. "layer 3 (MoE)", or KERNEL_FAULT)
    names where it started."""
    head = (f"the model's logits are not finite (NaN or inf) at output token "
            f"{req.num_generated}")
    if origin == KERNEL_FAULT:
        return (f"{head}, but the reference model computes these tokens with finite values: a "
                f"fault of the graph engine's kernels, not of the weights (please report it; "
                f"--engine reference runs this request on the plain model)")
    where = f", first in {origin}" if origin else ""
    return f"{head}{where}: a weight or a config value is out of range for this model"


def non_finite_rows(ids: list[int], logits: torch.Tensor, vocab: int | None = None) -> list[int]:
    """Rows of a graph decode step whose logits hold NaN or inf, found without a host sync on
    the hot path: the fused sampler (kernels/decode/sample_tokens.py) reads NaN as -inf and
    answers id 0 for a row with no finite logit, so only rows that drew id 0 are checked (one
    sync, for them alone). ids: the step's sampled ids; logits: [len(ids), V] on the device;
    vocab: the tokenizer's size (None: V). Only ids below vocab are checked: the decode graph
    sets the LM head's padding rows (ids >= vocab) to -inf, and counting those made every row
    that drew a genuine id 0 an error (seen on the H200, 2026-12-05: the "non-finite logits at
    output token 3" of the BF16 tool loop's first request was a greedy id 0).
    A row with some NaN logits that still drew another id keeps it (its NaNs counted as -inf,
    as the sampler's contract says)."""
    zero = [i for i, t in enumerate(ids) if t == 0]
    if not zero:
        return []
    finite = torch.isfinite(logits[zero, :vocab]).all(dim=-1).tolist()
    return [i for i, ok in zip(zero, finite) if not ok]


def _record_logprobs(rows: list[Request], logits: torch.Tensor, ids: list[int]) -> None:
    """Append to each row that asked (params.logprobs) the log-probability of its token under
    the step's logits [len(rows), V] (softmax, before temperature / top-k / top-p; a padded
    vocabulary is already -inf), and with params.top_logprobs its step's most likely
    (id, log-probability) pairs, most likely first."""
    want = [i for i, r in enumerate(rows) if r.params.logprobs]
    if not want:
        return
    lp = torch.log_softmax(logits[want].float(), dim=-1)
    picked = lp[torch.arange(len(want), device=lp.device),
                torch.tensor([ids[i] for i in want], device=lp.device)].tolist()
    for i, v in zip(want, picked):
        rows[i].logprobs.append(v)
    k = max(rows[i].params.top_logprobs for i in want)
    if k:  # one top-k for the rows that asked, each keeps its own count
        vals, top = lp.topk(k, dim=-1)
        for i, vs, ts in zip(want, vals.tolist(), top.tolist()):
            n = rows[i].params.top_logprobs
            if n:
                rows[i].top_logprobs.append(list(zip(ts[:n], vs[:n])))

"""Multi-turn KV reuse (issue 22): which finished sequence a new request can continue, and from
where.

The engine keeps the KV of recently finished sequences ("retained", least recently used first
out) with the token ids it holds. A new request takes the retained sequence sharing the longest
prefix of ids with its prompt and prefills only the rest; full-attention layers keep their KV up
to the resume point as it is. Sliding-window layers need the W − 1 keys before the resume point,
but their ring of W entries holds only the last W positions written, so a sequence of n cached
tokens can resume at n or n − 1 only (the query at position r reads keys r − W + 1 … r − 1, all
in a ring holding n − W … n − 1 exactly when r ≥ n − 1). To resume earlier the engine keeps ring
snapshots taken where a later prompt is likely to diverge: at the end of each prompt's prefill
(position P). GLM-4.7's next chat turn re-renders the previous generation prompt
`<|assistant|><think>` as `<|assistant|></think>…`, so it diverges at P − 1, which a snapshot
at P serves; a tool loop continues past the whole previous sequence, served by its live ring.
A chat request also marks where its preamble (system prompt and tool definitions) ends, at its
first `<|user|>` (`preamble_end`): the prefill stops there once to save the rings, so a new
conversation with the same system prompt and tools (a chat's /reset, an agent's next task)
resumes after them. Such a resume takes a copy of the preamble's KV and leaves the retained
sequence in place (`Match.fork`): taking it would hand one conversation's slot to the other,
so two conversations taking turns with the same tools each lost their history at every turn
(a bad-input trial, 2026-12-07: 416 of 609-1,228 prompt tokens cached a turn, against the
whole history without tools). Anything else falls back to a cold prefill, never to a wrong
ring.

Engine-agnostic: `Retained.kv` and the snapshot values are whatever the engine stores (a
reference `SequenceKV` and ring copies, or a graph-engine slot and ring copies); this module
only decides.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field


# Each reuse decision at DEBUG (which retained sequence a prompt resumes from, where, with which
# snapshot; why a prompt runs cold; what is retained and evicted): `logging.getLogger(
# "flint_graph.reuse").setLevel(logging.DEBUG)` with a handler, or tools/bench_reuse.py
# --log-reuse, shows why a turn was not served from the cache.
log = logging.getLogger("flint_graph.reuse")


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists. Compared by slices in a binary
    search (C-speed list equality): every admission checks each retained sequence, and a
    Python loop over a 100K-token prompt would cost tens of ms per sequence."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo]; a[:hi + 1] != b[:hi + 1] or hi = end
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def resume_point(cached: int, snapshots, lcp: int, prompt_len: int,
                 live_back: int = 1) -> tuple[int, int | None]:
    """(r, snapshot) for a prompt of `prompt_len` ids sharing `lcp` leading ids with a sequence
    of `cached` tokens whose rings were also saved at the positions in `snapshots`: prefill
    resumes at position r (r tokens reused; 0 = cold), restoring the rings of `snapshot` first
    (None: the live rings serve). r leaves at least one prompt token to prefill (its logits
    give the first output token) and never passes the cached tokens. The live rings serve r
    from `cached − live_back` on: 1 where they hold exactly the cached positions (a ring of W
    entries has one to spare), 0 where an interrupted step may have written position `cached`
    over the spare (`Retained.live_back`)."""
    top = min(lcp, prompt_len - 1, cached)
    if top <= 0:
        return 0, None
    if top >= cached - live_back:
        return top, None
    best = (0, None)
    for s in snapshots:
        r = min(top, s)
        if r >= s - 1 and r > best[0]:
            best = (r, s)
    return best


# the shortest chat preamble worth a snapshot of its own: a prompt without a system prompt or
# tools opens with [gMASK]<sop><|user|> (2 tokens), nothing to save a prefill stop for
PREAMBLE_MIN = 64


def preamble_end(ids: list[int], user_id: int | None) -> int | None:
    """Where a chat prompt's preamble ends: the index of its first `user_id` (`<|user|>`, which
    opens the first user message after the system prompt and the tool definitions in the
    GLM-4.7 layout, ../shared/glm47-format.md); None when it has none or a preamble shorter
    than PREAMBLE_MIN tokens."""
    if user_id is None:
        return None
    try:
        at = ids.index(user_id)
    except ValueError:
        return None
    return at if at >= PREAMBLE_MIN else None


_clock = itertools.count()
# ring snapshots kept per sequence (each: every sliding layer's ring): the two newest prompt
# ends and its chat preamble's end (`Request.snapshot_at`, never dropped for a newer one)
MAX_SNAPSHOTS = 3


@dataclass
class Retained:
    """A finished sequence kept for reuse: `ids` are the tokens whose KV `kv` holds (positions
    0 … len(ids) − 1); `snapshots` maps a position to the rings saved there (`preamble`, if
    set, is one of them: where its chat preamble ends); `live_back` is
    how far before len(ids) the live rings can resume (`resume_point`): 1, or 0 for a
    sequence whose last decode step was cut by Ctrl-C (its rings may hold position len(ids)
    over the spare entry that a resume one token earlier needs)."""

    ids: list[int]
    kv: object
    snapshots: dict[int, object] = field(default_factory=dict)
    last_used: int = field(default_factory=lambda: next(_clock))
    live_back: int = 1
    preamble: int | None = None  # the chat preamble's snapshot position, where it has one


@dataclass
class Match:
    """What `PrefixCache.take` found: the entry (now removed from the cache), the resume point
    and the snapshot to restore (None: the live rings). `fork`: the prompt shares only the
    entry's chat preamble, so the caller should copy the reused positions and put the entry
    back (`PrefixCache.add`) rather than continue in its KV, which holds another
    conversation."""

    entry: Retained
    reuse: int
    snapshot: int | None
    fork: bool = False


class PrefixCache:
    """Retained sequences, at most `capacity` (0 disables reuse). Not thread-safe: the engine
    calls it under its own lock."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"capacity {capacity}: expected >= 0")
        self.capacity = capacity
        self.entries: list[Retained] = []

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: Retained) -> list[Retained]:
        """Keep `entry`; returns the entries evicted to make room (least recently used first),
        or [entry] itself when the cache is disabled or the sequence is empty: the caller frees
        what comes back."""
        if self.capacity == 0 or not entry.ids:
            return [entry]
        self.entries.append(entry)
        out = []
        while len(self.entries) > self.capacity:
            out.append(self.evict())
        return out

    def evict(self) -> Retained | None:
        """Remove and return the least recently used entry (None when empty)."""
        if not self.entries:
            return None
        victim = min(self.entries, key=lambda e: e.last_used)
        self.entries.remove(victim)
        log.debug("evicted a retained sequence of %d ids", len(victim.ids))
        return victim

    def take(self, prompt: list[int]) -> Match | None:
        """The entry that lets `prompt` reuse the most tokens, removed from the cache, or None
        when no entry lets it reuse any (the cache is left as it was)."""
        best: Match | None = None
        seen = []
        for e in self.entries:
            lcp = common_prefix(e.ids, prompt)
            r, snap = resume_point(len(e.ids), e.snapshots, lcp, len(prompt), e.live_back)
            if log.isEnabledFor(logging.DEBUG):
                seen.append(f"{len(e.ids)} ids, common prefix {lcp}, snapshots "
                            f"{sorted(e.snapshots)} -> resume {r}")
            if r > 0 and (best is None or r > best.reuse):
                best = Match(e, r, snap)
        if best is not None:
            self.entries.remove(best.entry)
            e = best.entry
            best.fork = (best.snapshot is not None and best.snapshot == e.preamble
                         and len(e.ids) > e.preamble + 1)
            if best.fork:
                e.last_used = next(_clock)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("prompt of %d ids: %s; retained: %s", len(prompt),
                      f"resumes at {best.reuse} (snapshot {best.snapshot}"
                      f"{', a copy of its preamble' if best.fork else ''})" if best else "cold",
                      "; ".join(seen) or "none")
        return best

    def clear(self) -> list[Retained]:
        """Remove every entry; returns them (the caller frees their KV)."""
        out, self.entries = self.entries, []
        return out

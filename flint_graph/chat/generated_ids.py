"""Put the ids the model generated back into the next prompt (issue 22 item 2).

A chat keeps its history as messages, and the next prompt re-renders them as text and encodes
that text. Where the template writes an earlier assistant turn back exactly as the model wrote
it (a tool loop: the reasoning after the last user message is kept, GLM-4.7), encoding the text
again can still give other ids than the ones generated: BPE has many tokenisations of one
string and the model need not have produced the canonical one. Then the history the model sees
is not what it wrote, and the retained KV of that turn (flint_graph/runtime/prefix_cache.py) matches
only up to the first differing id.

`splice_generated` repairs that: when a new prompt starts with an earlier request's prompt and
continues with text that decodes exactly to that request's output (control tokens included),
those prompt ids are replaced by the generated ones. Nothing else changes. Text a caller
supplies (message content is encoded as ordinary text, prompt_segments.py) becomes control ids
this way only where, right after the very same prompt ids, it spells out exactly what the model
generated there: it then gets the model's own ids for it, nothing the model did not write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def _span_decoding_to(ids: Sequence[int], target: str,
                      decode: Callable[[Sequence[int]], str]) -> int | None:
    """The k with decode(ids[:k]) == target (a binary search on the decoded length, then the
    neighbours), or None."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) < len(target):
            lo = mid + 1
        else:
            hi = mid
    for k in (lo, lo + 1, lo - 1):
        if 0 < k <= len(ids) and decode(ids[:k]) == target:
            return k
    return None


def splice_generated(prompt: list[int], earlier: Iterable[tuple[list[int], list[int]]],
                     decode: Callable[[Sequence[int]], str]) -> list[int]:
    """`prompt` with the span after each earlier request's prompt replaced by that request's
    generated ids where the span decodes to exactly the same text.

    prompt: the new prompt's ids; earlier: (prompt ids, output ids) of finished requests;
    decode: ids -> text with control tokens kept (FlintTokenizer.decode(ids, False)). Earlier
    requests are applied shortest prompt first, each to the prompt as the ones before it left
    it: in a tool loop step k's prompt already holds steps 1 … k−1's generated ids, so it only
    matches the new prompt once those are spliced in (matched against the re-encoded text, only
    the first step's output would be restored). Returns `prompt` itself when none applies."""
    cur = prompt
    for p, out in sorted(earlier, key=lambda e: (len(e[0]), -len(e[1]))):
        n = len(p)
        if not out or cur[:n] != p:
            continue
        rest = cur[n:]
        if rest[:len(out)] == out:  # already the generated ids
            continue
        k = _span_decoding_to(rest, decode(out), decode)
        if k is not None:
            cur = p + list(out) + rest[k:]
    return cur

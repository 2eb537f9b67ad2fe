"""Python's cyclic garbage collector in a long-running command (chat, serve, generate).

A full (generation-2) collection scans every container object alive: with a model loaded that
is ~190K objects (the tiny checkpoint; the tokenizer, templates, torch's modules and the
engine), and one took 125 ms in the middle of `tools/load_serve.py`'s load on a 2-core machine
(2026-12-05), a pause every stream of the batch waits through (a decode step is ~1.7 ms on the
H200). Those objects live as long as the process, so the commands move them to the collector's
permanent generation once start-up is done (`gc.freeze`, as the Python documentation suggests
for objects that outlive the program's work); later collections scan only what requests
allocate.
"""

import gc


def freeze_startup_objects() -> None:
    """Collect once, then move every surviving object to the permanent generation (gc.freeze).

    For processes that build one LLM and keep it: a program that builds and drops several must
    not call this after each (cyclic garbage in the permanent generation is never collected)."""
    gc.collect()
    gc.freeze()

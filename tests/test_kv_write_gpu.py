"""GPU tests of the prefill's KV write kernel (kernels/prefill/kv_write.py) against its
reference, the indexed assignment capture/prefill.py made before it: both configs, both cache
kinds (rings and pages), chunk lengths that are no multiple of a CTA's rows (1, 77, 1000, 8,200),
caches poisoned with NaN; and the PDL ordering test for each input behind a slow producer.

Tolerance: bit-exact over the whole caches (a copy; entries not written keep their NaN, which
`nan_to_num` compares as equal values).
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.prefill import kv_write as kw

pytestmark = pytest.mark.gpu
PRESETS = ("tiny", "full")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("kv_write", "slow_producer")))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("tokens", [1, 77, 1000, 8200])
def test_kv_write_is_the_indexed_assignment(kset, preset, tokens):
    for spec in kw.KERNEL.specs(FlintConfig.preset(preset), ()):
        args = kw.make_args(spec, gen=_gen(tokens + spec["P"]), tokens=tokens)
        want_k, want_v = kw._reference(spec, *args)
        kset.get("kv_write", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        what = f"{spec.id} T={tokens}"
        assert _same(args[2], want_k), f"{what}: k_cache differs"
        assert _same(args[3], want_v), f"{what}: v_cache differs"
        written = int((~args[2].isnan()).all(-1).sum())
        assert written == tokens * spec["HKV"], f"{what}: {written} head rows written"


def test_pdl_kv_write_reads_inputs_after_the_wait(kset):
    """Each input overwritten by a slow producer gives the caches of the run without PDL.
    `where` and `entry` start as another in-bounds permutation (a stale index must still land
    in the cache, somewhere else)."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    for spec in kw.KERNEL.specs(FlintConfig.preset("full"), ()):
        args = kw.make_args(spec, gen=_gen(9), tokens=3000)
        consumer = kset.get("kv_write", **spec.as_dict())
        names = [a.name for a in kw.KERNEL.args(spec)]
        for name in ("k_new", "v_new", "where", "entry"):
            target = names.index(name)
            stale = None
            if name in ("where", "entry"):
                stale = args[target][torch.randperm(args[target].numel(), device="cuda")]
            (want,) = _graph_outputs(kset, consumer, [a.clone() for a in args], target,
                                     pdl=False, replays=1, stale=stale)
            for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS,
                                      stale=stale):
                for g, w in zip(got, want):
                    assert _same(g, w), f"{spec.id}: read {name} before griddepcontrol.wait"

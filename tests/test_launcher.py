"""Host-side checks of the launcher (no GPU, no DSL): arguments that do not match a kernel's
declaration are refused before launch, naming the kernel and the argument."""

import struct

import numpy as np
import pytest
import torch

from flint_graph.capture.launcher import LaunchError, check_args, needs_smem_opt_in, pack_args
from flint_graph.kernels.toolchain.spec import Launch, ScalarArg, Spec, TensorArg, param_layout

DECLS = (TensorArg("x", "bf16", (2, 64), "input"),
         TensorArg("w", "bf16", ("N", 64), "weight"),
         TensorArg("y", "bf16", (2, "N"), "output"),
         ScalarArg("eps", "f32"))


def _args(n=40):
    return [torch.randn(2, 64).bfloat16(), torch.randn(n, 64).bfloat16(),
            torch.empty(2, n, dtype=torch.bfloat16), 1e-5]


def check(values):
    return check_args("k/B=2", DECLS, values, device_type="cpu")


def test_valid_arguments_give_the_dynamic_extents():
    assert check(_args()) == {"N": 40}


@pytest.mark.parametrize("index, value, message", [
    (0, torch.randn(2, 64), r"argument x: dtype torch.float32, expected torch.bfloat16"),
    (0, torch.randn(3, 64).bfloat16(), r"argument x: shape \[3, 64\], expected \[2, 64\]"),
    (0, torch.randn(2, 64, 1).bfloat16(), r"argument x: shape \[2, 64, 1\], expected 2 dims"),
    (2, torch.empty(2, 41, dtype=torch.bfloat16), r"argument y: dim 1 is 41, but N = 40"),
    (1, torch.randn(64, 40).bfloat16().T, r"argument w: not contiguous"),
    (1, torch.randn(40 * 64 + 1).bfloat16()[1:].view(40, 64), r"argument w: data pointer .* "
                                                               r"not 16-byte aligned"),
    (3, torch.tensor(1e-5), r"argument eps: expected a real number \(f32\), found Tensor"),
    (3, True, r"argument eps: expected a real number \(f32\), found bool True"),
    (3, None, r"argument eps: expected a real number \(f32\), found NoneType None"),
    (3, 1e300, r"argument eps: float 1e\+300 is beyond the float32 range"),
    (3, 10**400, r"argument eps: int 1000.*\.\.\. is beyond the float32 range"),
    (0, torch.randn(2, 64).bfloat16().to_sparse(), r"argument x: a torch.sparse_coo tensor"),
    (0, torch.randn(2, 64).bfloat16()._neg_view(), r"argument x: a lazily negated"),
    (1, [1, 2], r"argument w: expected a torch tensor, found list"),
])
def test_mismatched_arguments_are_refused_by_name(index, value, message):
    values = _args()
    values[index] = value
    with pytest.raises(LaunchError, match=r"k/B=2: " + message):
        check(values)


INTS = (TensorArg("x", "i32", ("N",), "input"), ScalarArg("n", "i32"), ScalarArg("t", "i64"))


@pytest.mark.parametrize("index, value, message", [
    (1, True, r"argument n: expected an integer \(i32\), found bool True"),
    (1, 2.0, r"argument n: expected an integer \(i32\), found float 2.0"),
    (1, float("nan"), r"argument n: expected an integer \(i32\), found float nan"),
    (1, 2**31, r"argument n: int 2147483648 does not fit i32 \(-2147483648 to 2147483647\)"),
    (1, -2**31 - 1, r"argument n: int -2147483649 does not fit i32"),
    (2, 2**63, r"argument t: int 9223372036854775808 does not fit i64"),
    (2, np.float64(3.0), r"argument t: expected an integer \(i64\), found float64 "),
])
def test_integer_scalars_are_ints_in_range(index, value, message):
    """A bool, a float (even a whole one) or an int the field cannot hold is refused on the
    host; before, 2.5 went in as 2, True as 1, and 2**31 broke struct.pack."""
    values = [torch.zeros(4, dtype=torch.int32), 7, 5]
    values[index] = value
    with pytest.raises(LaunchError, match=r"k: " + message):
        check_args("k", INTS, values, device_type="cpu")


def test_numpy_scalars_pack_like_python_numbers():
    params, off = [], 0
    for a in DECLS:
        fields, size = param_layout(a)
        params.append({"arg": a.name, "offset": off, "size": size, "fields": fields})
        off += size
    values = _args()
    values[3] = np.float32(0.5)
    check(values)
    assert pack_args(params, values)[3] == struct.pack("<f", 0.5)
    ints = [torch.zeros(4, dtype=torch.int32), np.int64(-3), np.int32(2**31 - 1)]
    assert check_args("k", INTS, ints, device_type="cpu") == {"N": 4}
    with pytest.raises(LaunchError, match=r"k: argument n: value does not fit its i32"):
        pack_args([{"arg": "n", "size": 4, "fields": [["value", "i32", 0]]}], [2**40], "k")


def test_wrong_count_and_device_are_refused():
    with pytest.raises(LaunchError, match=r"3 arguments, expected 4 \(x, w, y, eps\)"):
        check(_args()[:3])
    with pytest.raises(LaunchError, match=r"argument x: on cpu, expected a cuda tensor"):
        check_args("k", DECLS, _args())


def test_empty_dynamic_extent_is_refused():
    with pytest.raises(LaunchError, match=r"argument w: dim 0 \(N\) is 0, expected ≥ 1"):
        check(_args(0))


def test_grid_follows_dynamic_extents():
    launch = Launch(grid=(("N", 16), 2, 1), block=(128, 1, 1))
    assert launch.grid_for({"N": 33}) == (3, 2, 1)
    assert Launch.from_json(launch.to_json()) == launch
    assert Spec.of("gemv", K=64, B=1).key == "B=1,K=64"


def test_every_declarable_dtype_can_be_launched():
    """A dtype a kernel may declare (spec.DTYPES) must be one the launcher checks and packs: a
    missing one (f64 once) failed only at launch, on the GPU."""
    from flint_graph.capture import launcher
    from flint_graph.kernels.toolchain.spec import DTYPES

    assert set(DTYPES) <= set(launcher._TORCH)


def test_capture_graph_pauses_the_garbage_collector(monkeypatch):
    """A collection during a capture can destroy another graph (illegal while capturing):
    capture_graph keeps the collector off inside and restores it after, errors included."""
    import contextlib
    import gc

    from flint_graph.capture import launcher

    seen = []

    @contextlib.contextmanager
    def fake_graph(graph, **kwargs):
        seen.append((graph, kwargs))
        yield

    monkeypatch.setattr(launcher.torch.cuda, "graph", fake_graph)
    assert gc.isenabled()
    with launcher.capture_graph("g", pool="p"):
        assert not gc.isenabled()
    assert gc.isenabled() and seen == [("g", {"pool": "p"})]
    try:
        with launcher.capture_graph("g"):
            raise KeyError("boom")
    except KeyError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with launcher.capture_graph("g"):
            pass
        assert not gc.isenabled(), "a collector the caller had off stays off"
    finally:
        gc.enable()


def test_shared_memory_opt_in_counts_the_static_part():
    """Opt in when dynamic + static shared memory pass 48 KB: 48 KB of dynamic beside 2 KB
    static failed to launch on the H200 without it."""
    assert not needs_smem_opt_in(46 * 1024, 2048)
    assert needs_smem_opt_in(48 * 1024, 2048)
    assert needs_smem_opt_in(48 * 1024 + 1, 0)
    assert not needs_smem_opt_in(48 * 1024, 0)

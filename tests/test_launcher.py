"""Host-side checks of the launcher (no GPU, no DSL): arguments that do not match a kernel's
declaration are refused before launch, naming the kernel and the argument."""

import pytest
import torch

from flint_graph.capture.launcher import LaunchError, check_args
from flint_graph.kernels.spec import Launch, ScalarArg, Spec, TensorArg

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
    (3, torch.tensor(1e-5), r"argument eps: expected a Python number \(f32\), found Tensor"),
    (1, [1, 2], r"argument w: expected a torch tensor, found list"),
])
def test_mismatched_arguments_are_refused_by_name(index, value, message):
    values = _args()
    values[index] = value
    with pytest.raises(LaunchError, match=r"k/B=2: " + message):
        check(values)


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

"""Shared test setup: GPU tests are marked `gpu` and skipped where CUDA is absent (CI)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run tools/gpu_check.sh on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
    """Path of a tiny synthetic checkpoint directory (BF16 files + model-nvfp4.gguf)."""
    from conftest_ckpt import build_tiny

    return build_tiny(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="session")
def tiny_llm(tiny_ckpt):
    """An LLM on the tiny checkpoint, on the CPU (shared: tests must not leave requests)."""
    from flint_graph import LLM

    return LLM(tiny_ckpt, device="cpu", progress=False)

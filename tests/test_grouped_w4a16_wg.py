"""CPU checks of grouped_w4a16_wg's declaration (kernels/prefill/grouped_w4a16_wg.py): the same
arguments as grouped_w4a16, specialisations for the full and flint-nano shapes (none for the
tiny config), a launch that two CTAs per SM can hold, and moe_route's place kernel built for
its tile sizes. The kernel runs in tests/test_grouped_w4a16_gpu.py and compiles for both
archs in tests/test_kernel_cache.py."""

import pytest

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import grouped_w4a16 as gw
from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg
from flint_graph.kernels.prefill import moe_route
from flint_graph.kernels.toolchain.spec import check_spec


@pytest.mark.parametrize("preset", ["nano", "full"])
def test_specialisations_and_launch(preset):
    cfg = FlintConfig.preset(preset)
    specs = gwg._specs(cfg)
    assert {(s["KIND"], s["NT"]) for s in specs} == {(k, n) for k in (0, 1) for n in gwg.NTS}
    for s in specs:
        args, launch = check_spec(gwg.KERNEL, s)
        ref = gw.KERNEL.args(gw.KERNEL.spec(KIND=s["KIND"], H=s["H"], M=s["M"], E=s["E"],
                                            NT=16, D=gw.DEPTH))
        assert [(a.name, a.shape) for a in args] == [(a.name, a.shape) for a in ref]
        assert launch.block == (256, 1, 1)
        assert launch.smem <= 113 * 1024  # two CTAs per SM
        n_out = s["M"] if s["KIND"] == 0 else s["H"]
        assert launch.grid[0] == n_out // gwg.cta_rows(s["KIND"])
    places = {s["NT"] for s in moe_route._specs(cfg) if s["KIND"] == 1}
    assert set(gwg.NTS) <= places and set(gw.NTS) <= places


def test_the_tiny_config_has_none():
    assert gwg._specs(FlintConfig.preset("tiny")) == []


@pytest.mark.parametrize("bad, match", [(dict(NT=32), "NT = 32"), (dict(KIND=2), "KIND = 2"),
                                        (dict(M=96), "multiple of 64"),
                                        (dict(WS=1), "no compile-time value WS"),
                                        (dict(W0=1), "W0 = 1 needs RS = 1")])
def test_unsupported_specialisations_are_refused(bad, match):
    values = dict(KIND=0, H=2048, M=512, E=256, NT=64) | bad
    with pytest.raises(ValueError, match=match):
        check_spec(gwg.KERNEL, gwg.KERNEL.spec(**values))


@pytest.mark.parametrize("preset", ["nano", "full"])
def test_every_spec_names_its_half_width_choice(preset):
    """SUB is explicit in every spec (the cache is asked for what a spec names) and RS named
    only where it is 1; the model's specs take the measured defaults per NT (`gwg.SUB`,
    `gwg.RS`), the benchmark list holds each model spec with the other SUB, with the other
    RS, and in its RS = 1 form with the other W0 (W0 named only where it is 1; the model's
    per NT, `gwg.W0`)."""
    cfg = FlintConfig.preset(preset)
    model, bench = gwg._specs(cfg), gwg.bench_specs(cfg)
    assert all(s["SUB"] == gwg.SUB[s["NT"]] for s in model)
    assert all(s.as_dict().get("RS", 0) == gwg.RS[s["NT"]] for s in model)
    assert all(s.as_dict().get("RS", 1) == 1 for s in model + bench)

    assert all(s.as_dict().get("W0", 0) == gwg.W0[s["NT"]] for s in model)
    assert all(s.as_dict().get("W0", 1) == 1 for s in model + bench)
    assert all(s.as_dict().get("RS", 0) for s in model + bench if s.as_dict().get("W0"))

    def key(s, **change):
        v = {"RS": 0, "W0": 0, **s.as_dict(), **change}
        return v["KIND"], v["NT"], v["SUB"], v["RS"], v["W0"]

    def rs1_other_w0(s):
        v = s.as_dict()
        return key(s, RS=1, W0=1 - v.get("W0", 0) if v.get("RS", 0) else 1)

    assert {key(s) for s in bench} == (
        {key(s, SUB=1 - s["SUB"]) for s in model}
        | {key(s, RS=1 - s.as_dict().get("RS", 0), W0=0) for s in model}
        | {rs1_other_w0(s) for s in model})
    for s in bench:  # two CTAs per SM
        assert check_spec(gwg.KERNEL, s)[1].smem <= 113 * 1024


def test_rs_zero_alone_names_the_plain_form():
    """RS=0 drops the model's W0 = 1 at NT = 64 (W0 is RS = 1's), so it names a built spec."""
    model = [s for s in gwg._specs(FlintConfig.preset("full")) if s["NT"] == 64]
    assert all(s.as_dict().get("W0") == 1 for s in model)
    for s in model:
        plain = gwg.variant(s, RS=0)
        assert "W0" not in plain.as_dict() and "RS" not in plain.as_dict()
        check_spec(gwg.KERNEL, plain)


def test_rs_zero_is_never_named():
    assert gwg.spec_values(KIND=0, NT=64, SUB=0, RS=0, W0=0) == {"KIND": 0, "NT": 64, "SUB": 0}
    assert gwg.spec_values(KIND=0, NT=64, SUB=0, RS=1)["RS"] == 1


@pytest.mark.parametrize("values,ok", [({}, True), ({"RS": 0}, True), ({"SUB": 1}, True),
                                       ({"SUB": 0, "RS": 1}, False), ({"WS": 1}, False),
                                       ({"WP": 2}, False), ({"RS": 1, "W0": 1}, True),
                                       ({"W0": 1}, False), ({"RS": 0, "W0": 1}, False),
                                       ({"W0": 0}, True), ({"RS": 1, "W0": 0}, True)])
def test_check_variant_accepts_what_the_cache_build_makes(values, ok):
    """check_variant passes a variant exactly when every NT's spec is valid and built."""
    if ok:
        gwg.check_variant(values)
    else:
        with pytest.raises(ValueError):
            gwg.check_variant(values)


@pytest.mark.parametrize("key", ["SUB", "RS", "W0"])
def test_switches_are_zero_or_one(key):
    with pytest.raises(ValueError, match=f"{key} = 2"):
        check_spec(gwg.KERNEL, gwg.KERNEL.spec(KIND=0, H=2048, M=512, E=256, NT=128,
                                               **{"SUB": 1, key: 2}))


def test_pair_order_puts_each_code_words_pairs_side_by_side():
    """RS = 1's input order: position 2i + j of each 8-element chunk holds element i + 4j, and
    natural_order undoes it."""
    import torch

    x = torch.arange(2 * 16).reshape(2, 16)
    p = gwg.pair_order(x)
    assert p[0, :8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert p[1, 8:].tolist() == [24, 28, 25, 29, 26, 30, 27, 31]
    assert torch.equal(gwg.natural_order(p), x)


@pytest.mark.parametrize("kind", [0, 1])
def test_the_rs_reference_is_the_plain_one_in_pair_order(kind):
    """With RS = 1 the arguments carry the input in pair order and KIND 0's reference output
    is in it too (so down's RS = 1 reads gate/up's output as it is); flint-nano's shapes on
    the CPU."""
    import torch

    cfg = FlintConfig.preset("nano")
    rs = [s for s in gwg._specs(cfg) if s["KIND"] == kind and s["NT"] == 64][0]
    assert rs["RS"] == 1  # the default at NT = 64
    plain = gwg.KERNEL.spec(**gwg.spec_values(**{**rs.as_dict(), "RS": 0}))
    args = gw.make_args(plain, gen=torch.Generator().manual_seed(1), tokens=40,
                        experts_used=6, device="cpu")
    got = gwg.make_args(rs, gen=torch.Generator().manual_seed(1), tokens=40, experts_used=6,
                        device="cpu")
    assert torch.equal(got[0], gwg.pair_order(args[0]))
    (want,) = gw._reference(plain, *[a.clone() for a in args])
    (out,) = gwg._reference(rs, *[a.clone() for a in got])
    want = gwg.pair_order(want) if kind == 0 else want
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.nan_to_num(), want.nan_to_num())

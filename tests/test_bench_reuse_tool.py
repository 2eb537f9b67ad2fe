"""tools/bench_reuse.py on the CPU (tiny preset): per turn the TTFT's phases, the allocator
counters (empty on the CPU) and, with --profile-turns, that turn's torch.profiler table written beside reuse.json;
a bad --profile-turns is a usage error before any work."""

import json
import sys

import pytest
from tool_module import tool_module


@pytest.fixture(scope="module")
def bench():
    return tool_module("bench_reuse")


def test_turn_rows_and_a_profiled_turn(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_reuse.py", "--preset", "tiny", "--device", "cpu",
                                      "--history", "120", "--turns", "2", "--max-tokens", "2",
                                      "--profile-turns", "1", "--out", str(tmp_path)])
    assert bench.main() == 0
    res = json.loads((tmp_path / "reuse.json").read_text())
    on, off = res["on"], res["off"]
    assert [r["turn"] for r in on] == [0, 1] and on[1]["cached_tokens"] > 0
    assert all(r["allocator"] == {} for r in on)  # the CPU has no caching allocator
    for r in on + off:  # the TTFT split into its phases (GenerationOutput.ttft_phases_ms)
        phases = r["phases_ms"]
        assert set(phases) == {"queued", "admit", "schedule", "prefill", "first_token"}, phases
        assert all(v >= 0 for v in phases.values())
        assert sum(phases.values()) == pytest.approx(r["ttft_ms"], abs=0.01)
    assert all(r["cached_tokens"] == 0 for r in off)
    table = (tmp_path / "profile-turn1.txt").read_text()
    assert "Self CPU" in table and not (tmp_path / "profile-turn0.txt").exists()


def test_bad_profile_turns_is_a_usage_error(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_reuse.py", "--profile-turns", "1,x"])
    with pytest.raises(SystemExit) as e:
        bench.main()
    assert e.value.code == 2 and "--profile-turns '1,x'" in capsys.readouterr().err

"""Fuzzing the input surfaces (issue 26 item 8) with hypothesis: mutated GGUF files, config
mappings, safetensors headers, chat templates, chat requests and tool-call outputs under
random schemas. Every case must end as a success or a clean error (a FlintError, or the
ValueError / TypeError an API documents) within its time limit; anything else (a traceback,
a hang) fails the run. Crashes and memory blow-ups are caught one level up: CI runs this file
in a child process under a memory limit (`test_fuzz_suite_in_a_bounded_process` below), so a
crash or an allocation past the limit fails that test instead of the whole session.

    FLINT_FUZZ=1 FLINT_FUZZ_EXAMPLES=2000 FLINT_FUZZ_REPORT=out.json pytest tests/test_fuzz.py

runs the long campaign (5 targets × 2,000 = 10,000 cases plus the parser's), writing the
outcome counts per target to FLINT_FUZZ_REPORT (docs/hardening.md records the last ones).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import struct
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from flint_graph.errors import FlintError  # noqa: E402

FUZZ = os.environ.get("FLINT_FUZZ") == "1"
EXAMPLES = int(os.environ.get("FLINT_FUZZ_EXAMPLES", "150"))
CASE_SECONDS = 10  # one case's limit (a load of the tiny checkpoint takes ~50 ms)
COUNTS: dict[str, Counter] = defaultdict(Counter)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=not FUZZ,
                    suppress_health_check=list(HealthCheck))
fuzz_only = pytest.mark.skipif(not FUZZ, reason="set FLINT_FUZZ=1 (CI runs this file in a "
                                                "bounded child process)")


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang(f"a case ran past {CASE_SECONDS} s")


def _case(target: str, fn, *args, clean=(FlintError,)):
    """Run one case: a success or a clean error is counted; anything else is counted and
    re-raised (hypothesis then shrinks it to a minimal input)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        fn(*args)
        COUNTS[target]["success"] += 1
    except clean:
        COUNTS[target]["clean error"] += 1
    except Hang:
        COUNTS[target]["hang"] += 1
        raise
    except MemoryError:
        COUNTS[target]["memory"] += 1
        raise
    except Exception:
        COUNTS[target]["traceback"] += 1
        raise
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("FLINT_FUZZ_REPORT")
    if path and COUNTS:
        Path(path).write_text(json.dumps({k: dict(v) for k, v in COUNTS.items()}, indent=1))


# -- GGUF files -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_bytes(tiny_ckpt):
    return (Path(tiny_ckpt) / "model-nvfp4.gguf").read_bytes()


MUTATIONS = st.lists(st.tuples(st.sampled_from(["byte", "u32", "u64", "cut"]),
                               st.integers(0, 1 << 20),
                               st.integers(0, (1 << 64) - 1)), min_size=1, max_size=4)


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, at, value in edits:
        if kind == "cut":
            del buf[at % max(1, len(buf)):]
            continue
        width = {"byte": 1, "u32": 4, "u64": 8}[kind]
        if len(buf) < width:
            continue
        at = at % (len(buf) - width + 1)
        # mostly inside the header / metadata / tensor infos, where the structure lives
        if at > 4096 and value % 4:
            at %= 4096
        buf[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    return bytes(buf)


@fuzz_only
@SETTINGS
@given(edits=MUTATIONS)
def test_fuzz_gguf(gguf_bytes, tmp_path_factory, edits):
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.checkpoints.gguf_checkpoint import load_gguf, read_gguf_metadata

    path = tmp_path_factory.mktemp("g") / "m.gguf"
    path.write_bytes(_mutate(gguf_bytes, edits))

    def load():
        read_gguf_metadata(path)
        load_gguf(path, FlintConfig.preset("tiny"), "cpu", progress=False)

    _case("gguf", load)


# -- config mappings and safetensors headers --------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@fuzz_only
@SETTINGS
@given(changes=st.dictionaries(st.sampled_from(
    ["vocab_size", "hidden_size", "num_hidden_layers", "sliding_window", "layer_types",
     "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
     "n_routed_experts", "num_experts_per_tok", "routed_scaling_factor", "qk_norm",
     "first_k_dense_replace", "max_position_embeddings", "architectures", "model_type"]),
    JSON_VALUES, min_size=1, max_size=4))
def test_fuzz_config(changes):
    from flint_graph.checkpoints.config import FlintConfig

    raw = {**FlintConfig.preset("tiny").to_dict(), **changes}
    _case("config", FlintConfig.from_dict, raw)


@fuzz_only
@SETTINGS
@given(header=st.one_of(JSON_VALUES, st.dictionaries(
    st.text(max_size=6), st.fixed_dictionaries({"dtype": JSON_VALUES, "shape": JSON_VALUES,
                                                 "data_offsets": JSON_VALUES}), max_size=3)),
       data=st.binary(max_size=64))
def test_fuzz_safetensors_header(tmp_path_factory, header, data):
    from flint_graph.checkpoints.hf_checkpoint import read_safetensors_header

    path = tmp_path_factory.mktemp("s") / "x.safetensors"
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    _case("safetensors", read_safetensors_header, path)


# -- chat templates, requests, outputs --------------------------------------------------------

SNIPPETS = ["{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}",
            "{% for i in range(N) %}{% for j in range(N) %}x{% endfor %}{% endfor %}",
            "{{ 'a' * N }}", "{{ N ** N }}", "{% set s = 'ab' %}{{ s ~ s ~ s }}",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{{ lipsum(n=N) }}",
            "{{ raise_exception('no') }}", "{{ messages[N] }}", "{{ (N ** 3) | string }}",
            "{% if true %}", "{% endif %}", "{{ tools | tojson }}", "{{ ''.join([]) }}",
            "{{ ().__class__ }}", "{{ range.__globals__ }}", "{{", "}}", "{% raw %}"]


@fuzz_only
@SETTINGS
@given(parts=st.lists(st.tuples(st.sampled_from(SNIPPETS), st.integers(0, 10 ** 6)),
                      min_size=1, max_size=6))
def test_fuzz_template(parts):
    from flint_graph.chat.chat_template import render_chat

    template = "".join(s.replace("N", str(n)) for s, n in parts)
    _case("template", render_chat, template, [{"role": "user", "content": "hi"}])


MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "admin", 5]),
     "content": st.one_of(st.text(max_size=40), st.none(), st.integers(),
                          st.lists(st.fixed_dictionaries({"type": st.sampled_from(
                              ["text", "image"]), "text": st.text(max_size=10)}), max_size=2))},
    optional={"tool_calls": JSON_VALUES, "reasoning_content": JSON_VALUES,
              "name": JSON_VALUES}), max_size=4)


@fuzz_only
@SETTINGS
@given(messages=MESSAGES, tools=st.one_of(st.none(), JSON_VALUES, st.lists(st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.text(min_size=1, max_size=8)}, optional={"parameters": JSON_VALUES})}),
    max_size=2)), choice=st.one_of(st.none(), JSON_VALUES, st.sampled_from(
        ["none", "auto", "required"])), max_tokens=st.one_of(st.none(), JSON_VALUES))
def test_fuzz_chat_request(tiny_llm, messages, tools, choice, max_tokens):
    from flint_graph.runtime.sampling import SamplingParams

    def build():
        params = SamplingParams(max_tokens=max_tokens)  # a bad value: InvalidRequestError
        req = tiny_llm._chat_request(messages, tools, params, enable_thinking=True,
                                     tool_choice=choice)
        tiny_llm.engine.abort(req) if req in tiny_llm.engine.waiting else None

    _case("chat request", build, clean=(FlintError, TypeError))


SCHEMAS = st.recursive(
    st.fixed_dictionaries({}, optional={"type": st.sampled_from(
        ["string", "integer", "number", "boolean", "array", "object", "null"]) | JSON_VALUES,
        "enum": JSON_VALUES, "const": JSON_VALUES, "$ref": st.sampled_from(
            ["#", "#/$defs/A", "#/properties/x", "#/$defs/A/0", "#/x²"])}),
    lambda inner: st.fixed_dictionaries({}, optional={
        "anyOf": st.lists(inner, max_size=3), "oneOf": st.lists(inner, max_size=3),
        "allOf": st.lists(inner, max_size=2) | JSON_VALUES,
        "properties": st.dictionaries(st.sampled_from(["x", "y", "kind"]), inner, max_size=3),
        "additionalProperties": st.booleans() | inner, "required": JSON_VALUES}),
    max_leaves=10)


@fuzz_only
@SETTINGS
@given(params=SCHEMAS, defs=SCHEMAS, args=st.lists(st.tuples(
    st.sampled_from(["x", "y", "kind", "z"]), st.text(max_size=12) | st.sampled_from(
        ["7", "[1, 2]", '{"a": 1}', "null", "true", '"5"', "[" * 70 + "]" * 70,
         '["\\ud800"]'])), max_size=3),
       cut=st.integers(1, 12))
def test_fuzz_tool_call_parse(params, defs, args, cut):
    from flint_graph.chat.output_parser import OutputParser, parse_output

    schema = {**params, "$defs": {"A": defs}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in args)
    text = f"</think><tool_call>f{body}</tool_call>"

    def parse():
        whole = parse_output(text, tools=tools)
        p = OutputParser(tools)
        for i in range(0, len(text), cut):
            p.feed(text[i:i + cut])
        p.finish("stop")
        streamed = p.result()
        assert streamed.tool_calls == whole.tool_calls, (streamed, whole)
        for call in whole.tool_calls:
            json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")

    _case("tool-call parse", parse)


# -- CI: the suite in a bounded child process ---------------------------------------------------

MEMORY_LIMIT = 8 << 30  # bytes of address space for the child (torch included)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.skipif(FUZZ, reason="this is the runner; FLINT_FUZZ=1 runs the cases themselves")
def test_fuzz_suite_in_a_bounded_process(tmp_path):
    """Every fuzz target, FLINT_FUZZ_EXAMPLES cases each (150 in CI), in a child pytest
    limited to 8 GiB of address space and 15 minutes: a crash (signal), an allocation past the
    limit (MemoryError) or a hang fails this test, with the child's output."""
    report = tmp_path / "counts.json"
    env = {**os.environ, "FLINT_FUZZ": "1", "FLINT_FUZZ_REPORT": str(report)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        __file__], env=env, capture_output=True, text=True, timeout=900,
                       preexec_fn=_limit_memory, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, (r.returncode, r.stdout[-4000:], r.stderr[-2000:])
    counts = json.loads(report.read_text())
    bad = {t: c for t, c in counts.items() if set(c) - {"success", "clean error"}}
    assert not bad, bad
    assert len(counts) == 6, counts

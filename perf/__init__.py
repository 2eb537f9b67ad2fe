"""Latency tools: `flint-graph bench` (decode step times against the roofline floor and the
baselines, end to end, prefill, TTFT, cold start) and `flint-graph trace` (one decode step per
kernel, with a Perfetto timeline). Collection lives in `bench` / `trace`; everything that only
reads their JSON (tables, comparisons, the timeline file, the HTML plot) in `bench_report` /
`trace_report`, so the CPU tests cover it without a GPU."""

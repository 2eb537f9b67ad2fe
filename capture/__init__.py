"""cuda-python launcher and per-bucket decode-graph capture (`flint_graph.capture`). Empty until
the capture issues land."""

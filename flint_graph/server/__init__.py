"""`flint-graph serve`: the OpenAI-compatible HTTP server (app.py routes, protocol.py bodies)."""

"""See flint_graph.kernels (kernels/__init__.py) for what this folder holds."""

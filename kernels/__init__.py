"""CuTe DSL kernels (`flint_graph.kernels`), one family per file with its plain-PyTorch
reference; compiled ahead of time into a cubin cache. Empty until the kernel issues land."""

"""Units: sizes are binary (GiB = 2^30 B), rates decimal (GB/s = 1e9 B/s), as vendors print them."""

MiB = 1 << 20
GiB = 1 << 30

GB = 1e9
TFLOP = 1e12
US = 1e-6

MAX_COUNT = 1 << 24
"""The largest device count, global batch (sequences) or sequence length ndplan plans for:
16,777,216, beyond any cluster, batch or context trained so far. The search enumerates the
divisors of these numbers; a mistyped 10^15 would run for hours rather than fail."""

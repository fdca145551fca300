"""Units: sizes are binary (GiB = 2^30 B), rates decimal (GB/s = 1e9 B/s), as vendors print them."""

MiB = 1 << 20
GiB = 1 << 30

GB = 1e9
TFLOP = 1e12
US = 1e-6

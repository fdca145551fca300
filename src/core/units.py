"""Units: sizes are binary (GiB = 2^30 B), rates decimal (GB/s = 1e9 B/s), as vendors print them."""

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

GB = 1e9
TB = 1e12
TFLOP = 1e12
US = 1e-6


def gib(num_bytes: float) -> float:
    """Bytes as GiB."""
    return num_bytes / GiB


def mib(num_bytes: float) -> float:
    """Bytes as MiB."""
    return num_bytes / MiB

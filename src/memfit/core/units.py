"""Byte formatting for messages: always with a unit, binary (GiB = 2**30) unless told otherwise."""

from __future__ import annotations

GiB = 2**30
GB = 10**9


def fmt_bytes(n: int, unit: str = "GiB") -> str:
    """``fmt_bytes(14_246_156_288)`` -> ``'13.27 GiB'``; ``unit='GB'`` -> ``'14.25 GB'``."""
    if abs(n) >= 2**1000:  # beyond a float: no real size, but never an OverflowError
        return f"about 2^{abs(n).bit_length() - 1} bytes"
    if unit == "GB":
        return f"{n / GB:,.2f} GB"
    if unit == "MiB":
        return f"{n / 2**20:,.1f} MiB"
    if abs(n) < GiB // 10:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / GiB:,.2f} GiB"


def fmt_both(n: int) -> str:
    """``'13.27 GiB (14.25 GB)'``."""
    return f"{fmt_bytes(n)} ({fmt_bytes(n, 'GB')})"

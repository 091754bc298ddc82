"""Kernel fixtures live in tpunb_kernels.py so tests can also start kernels themselves."""

from tpunb_kernels import fresh_kernel, kernel  # noqa: F401

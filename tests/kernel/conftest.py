"""Kernel fixtures live in kernels.py so tests can also start kernels themselves."""

from kernels import fresh_kernel, kernel  # noqa: F401

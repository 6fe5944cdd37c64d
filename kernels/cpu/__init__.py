"""The CPU backend: native C kernels (built at first use by build.py), their ctypes
wrappers, oneDNN-packed and int8 matmuls, and the torch backend's op set (ops.py)."""

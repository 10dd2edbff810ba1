"""``kvldp bench``: the Beam pipeline's throughput next to the pure-NumPy
path (``command.py``), the kernels against the peer libraries
(``kernels.py``), the sweep over sizes (``sweep.py``) and the streaming
collector's throughput and latency (``stream.py``)."""

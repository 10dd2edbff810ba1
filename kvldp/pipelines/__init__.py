"""The jobs behind the ``kvldp`` command.

Importing this package sets the C heap up for the in-process local runner
(one glibc arena for all threads: ``allocator.py``) -- first, before
pyarrow's or Beam's imports start threads, after which it could not.
"""
from kvldp.pipelines.allocator import one_arena

one_arena()

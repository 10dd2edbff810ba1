"""What a run shows: figures (``figures.py``, matplotlib) and the tables a
command prints (``tables.py``)."""

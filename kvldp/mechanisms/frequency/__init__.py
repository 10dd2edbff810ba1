"""Frequency oracles (GRR, SUE, OUE, OLH) and the pieces every key-value
mechanism builds on them: choosing the pair a user reports (``sampling``),
the padding length (``padding``) and counting report symbols (``symbols``)."""

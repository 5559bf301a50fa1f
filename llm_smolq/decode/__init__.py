"""Decoding: sampling, the generate loop, and decoding constrained by a schema or grammar."""

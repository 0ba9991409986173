"""The shard store: format, writer, id index, memory-mapped reader and verify.

Imports numpy, zarr, numcodecs and pyarrow only: no torch, no Beam.
"""

"""The shard store: format, writer, id index, memory-mapped reader and verify.

Imports numpy, zarr and numcodecs; pyarrow for the Parquet passage tables, scipy only to train a codebook, fsspec
and aiohttp only for a store at a URL; no torch, no Beam (tests/test_layering.py holds the list).
"""

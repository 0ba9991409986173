"""The offline half of precompute as plain functions: which model makes which store kind, and encoding passages into
records."""

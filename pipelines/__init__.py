"""Beam PTransforms: thin wiring over pure functions from reader/ and storage/."""

"""Each model defined once, with its offline and online halves: DilBert, EARL, the baseline rankers, checkpoints and
fingerprints."""

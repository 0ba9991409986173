"""Data formats: SQuAD, QA features and their batches, TREC runs and qrels, ranking triples and paragraphs."""

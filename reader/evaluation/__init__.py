"""Metrics and evaluation drivers: SQuAD EM/F1, reading comprehension, open-domain QA, ranking metrics and ranking evaluation."""

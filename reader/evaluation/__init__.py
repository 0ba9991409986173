"""Metrics and evaluation drivers: the SQuAD EM/F1 metric, reading comprehension, open-domain QA,
ranking metrics and ranking evaluation.
"""

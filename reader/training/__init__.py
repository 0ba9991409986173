"""Fine-tuning readers and rankers: one loop, one run template, losses, resumable state, release and model cards."""

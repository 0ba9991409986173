"""The checkpoints shipped inside the package, and how to find them (the files stay in reader/models/)."""

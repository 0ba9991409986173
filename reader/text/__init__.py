"""Text as the models see it: tokenization conventions and line-numbered reading of text files."""

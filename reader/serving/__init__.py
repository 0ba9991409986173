"""Online inference over a store: the open-domain reader, reranking, span decoding, answers,
shared timing and stored-state padding.

Serving never imports training; only evaluation and the runners import serving.
"""

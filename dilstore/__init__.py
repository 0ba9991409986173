"""dilstore: precompute the query-independent states of transformer readers and rankers, store them, serve them.

The layers install under this one name: `dilstore.storage` (the shard store),
`dilstore.reader` (models, serving, training, evaluation), `dilstore.pipelines`
(the Beam precompute job) and `dilstore.runners` (the `dilstore` command).
"""

"""Model definitions (offline and online halves), online inference, training and metrics.

Never imports apache_beam: a query server installs reader/ and storage/ only.
"""

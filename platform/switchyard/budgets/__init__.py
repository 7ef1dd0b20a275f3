"""Cost controls: prices, token estimates, budget resolution, the spend ledger and rate limits.

Pure core (no Ray): `switchyard.cluster.ledger` puts the ledger on the cluster.
"""

"""The Ray adapters that put the pure cores on the cluster: named actors, Serve handles, metrics."""

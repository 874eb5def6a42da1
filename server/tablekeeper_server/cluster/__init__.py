"""Cluster coordination: membership, the controller, and container placement. Serving code
meets it only through `Assignment` values."""

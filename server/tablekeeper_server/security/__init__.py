"""Transport security (TLS), authentication (bearer tokens, client certificates) and
authorization (per-namespace permissions)."""

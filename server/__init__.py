"""softhca.server."""

"""softhca.protocol."""

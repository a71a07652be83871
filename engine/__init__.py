"""softhca.engine."""

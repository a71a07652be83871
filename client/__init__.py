"""softhca.client."""

"""Tasks beyond plain translation: constituency parsing as translation (trees, linearization)."""

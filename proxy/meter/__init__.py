"""meter."""

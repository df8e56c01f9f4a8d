"""The API dialects: what each streaming format says about tokens, usage and errors."""

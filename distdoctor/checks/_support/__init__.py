"""Private helpers of the built-in checks (no checks here: the loader skips this package)."""

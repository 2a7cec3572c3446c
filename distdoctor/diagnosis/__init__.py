"""One diagnosis of a running or failed job from per-rank snapshots, whatever produced them."""

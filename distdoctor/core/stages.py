"""The stages of a run, in order, and which of them need a world of ranks."""

STAGES: tuple[str, ...] = ("local", "rendezvous", "collective")
# The stages that need a world of ranks; a run without them stays on this process.
CROSS_RANK_STAGES: tuple[str, ...] = ("rendezvous", "collective")

"""`distdoctor bench`: collective bandwidth in nccl-tests' terms, and the slow link found by name."""

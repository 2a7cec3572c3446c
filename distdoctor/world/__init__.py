"""A world of ranks: the store exchange, one rank's run, the self-test and the watchdog."""

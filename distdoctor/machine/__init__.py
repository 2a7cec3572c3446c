"""What one host can tell: the launcher that started it, probes of its network and devices."""

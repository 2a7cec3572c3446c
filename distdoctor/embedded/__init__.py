"""What runs inside a training script: preflight, the bounded init and their checks."""

"""The job as a picture: a guard's report directory or flight-recorder dumps as trace.json and an HTML report."""

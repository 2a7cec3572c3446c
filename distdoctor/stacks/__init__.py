"""`distdoctor stacks`: every rank's stack read from outside with py-spy, grouped, and the job diagnosed."""

#     from distdoctor.stacks import look, look_slurm_job
#     report = look([torchrun_pid])          # a distdoctor.core.report.Report; never prints
#
# procs finds the ranks (/proc: their variables, their launcher), sampling reads each one again
# and again (its /proc clock, then pyspy's dump), snapshots turns a read into a diagnosis
# RankSnapshot, job judges one job (diagnosis.progress over every rank's reads, plus what only
# `stacks` knows), look does it for this node until the reads decide, slurm for every node of a
# SLURM job, watch (rendered by watch_view) keeps reading for --watch. Nothing here sends a signal
# to the job or writes into it. Importing this package registers the stacks.* finding kinds; none
# of its modules imports torch.

from __future__ import annotations

from distdoctor.stacks.look import look
from distdoctor.stacks.slurm import look_slurm_job

__all__ = ["look", "look_slurm_job"]

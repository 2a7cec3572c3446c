"""stacks.sources: a rank's own script naming DistributedDataParallel, read once per change, never torch's files."""

from __future__ import annotations

import os

from distdoctor.stacks.sources import file_names_ddp


def test_a_users_script_that_names_ddp_is_evidence_and_one_that_does_not_is_not(tmp_path):
    ddp = tmp_path / "train.py"
    ddp.write_text("from torch.nn.parallel import DistributedDataParallel\nmodel = DistributedDataParallel(m)\n")
    plain = tmp_path / "eval.py"
    plain.write_text("model = MyDDPLikeThing()  # not the wrapper\n")
    assert file_names_ddp(str(ddp)) and not file_names_ddp(str(plain))
    # Edited: read again (the cache is keyed by the modification time).
    plain.write_text("model = torch.nn.parallel.DistributedDataParallel(m)\n")
    os.utime(plain, ns=(1, 10**18))
    assert file_names_ddp(str(plain))


def test_missing_files_and_library_files_are_no_evidence(tmp_path):
    assert not file_names_ddp(str(tmp_path / "gone.py"))
    import torch.nn.parallel.distributed as ddp_module

    assert not file_names_ddp(ddp_module.__file__)  # torch's own file names it, of course

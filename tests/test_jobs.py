"""Job entry points (captioning.jobs): a user error is one line and exit status 2; no DDP process
group outlives the job."""

from __future__ import annotations

import errno

import pytest

from captioning.errors import ConfigError
from captioning.jobs import cli_errors


def test_a_job_entry_point_destroys_the_process_group_it_leaves(tmp_path):
    """Gloo threads left to interpreter teardown can abort a finished DDP process: cli_errors
    destroys the group when the job returns, and when it fails."""
    import torch.distributed as dist

    def job(fail: bool) -> str:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / ('store' + str(fail))}", rank=0, world_size=1)
        if fail:
            raise ConfigError("bad")
        return "done"

    assert cli_errors(job)(False) == "done" and not dist.is_initialized()
    with pytest.raises(SystemExit):
        cli_errors(job)(True)
    assert not dist.is_initialized()


def test_a_user_error_is_one_line_and_exit_status_2(capsys):
    def bad_key() -> None:
        raise ConfigError("unknown config key 'modle' for TrainConfig: check its spelling")

    def full_disk() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "out/shard.npy")

    def bug() -> None:
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(SystemExit) as exit_:
        cli_errors(bad_key)()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: unknown config key 'modle' for TrainConfig: check its spelling\n"
    with pytest.raises(SystemExit) as exit_:
        cli_errors(full_disk)()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: No space left on device while writing out/shard.npy; files finished before are intact")
    with pytest.raises(OSError, match="Input/output error"):  # any other OSError is a bug: its traceback stays
        cli_errors(bug)()

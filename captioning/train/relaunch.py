"""DDP ranks of a sweep job: started as the job alone in its own folder.

Lightning's subprocess launcher (``strategy=ddp`` without a cluster launcher) starts ranks 1..N-1
by running ``sys.argv`` again with ``hydra.run.dir=<hydra.run.dir>``.  In a Hydra multirun that
command is the whole sweep (``-m`` and every swept value) and ``hydra.run.dir`` is not the job's
folder: each rank would start a sweep of its own.  ``as_single_run`` makes both what they are for
the job: its own overrides (the swept values resolved) and its own folder.

The launcher also leaves ``LOCAL_RANK``, ``WORLD_SIZE`` and the rendezvous address in the process
environment; the next DDP job of a sweep run in the same process (Hydra's basic launcher) would
read them as ranks started by a cluster and wait for peers that never come.  The block restores
the environment it found.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict, read_write


@contextlib.contextmanager
def as_single_run() -> Iterator[None]:
    """Within a multirun job: ``sys.argv`` = the job's own overrides and ``hydra.run.dir`` = its
    folder, until the block ends (a single run keeps its own); the process environment is restored
    when it ends."""
    environ = dict(os.environ)
    try:
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            with _job_argv():
                yield
        else:
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)


@contextlib.contextmanager
def _job_argv() -> Iterator[None]:
    hydra = HydraConfig.get()
    argv, run_dir = sys.argv, hydra.run.dir
    with read_write(hydra), open_dict(hydra):
        hydra.run.dir = hydra.runtime.output_dir
    sys.argv = [argv[0], *hydra.overrides.task]
    try:
        yield
    finally:
        sys.argv = argv
        with read_write(hydra), open_dict(hydra):
            hydra.run.dir = run_dir

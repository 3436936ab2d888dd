"""Job entry points: a user error is one line and exit status 2, never a traceback, and a job
leaves no DDP process group behind.

``cli_errors`` wraps every console script's ``main``: a ``CaptioningError`` (or a full disk) prints
``error: <one line>`` and exits with status 2; inside a Hydra sweep it raises ``JobFailed`` instead,
so the sweep records that job as failed and goes on with the others.  When the job ends, the
``torch.distributed`` group it made (DDP ranks) is destroyed (``release_process_group``).
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from captioning.errors import CaptioningError


class JobFailed(CaptioningError):
    """A sweep job's one-line error, raised instead of exiting: Hydra records the job as failed (the
    sweep summary shows the line) and goes on with the other jobs."""


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    if _in_multirun():
        raise JobFailed(message)
    sys.exit(2)


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for job entry points: a CaptioningError, or a full disk, is one line and exit status 2
    (in a sweep: the job fails with that line and the sweep goes on); the DDP process group, if the
    job made one, is destroyed when it ends."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JobFailed:
            raise
        except CaptioningError as e:
            _fail(str(e))
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            where = f" while writing {e.filename}" if e.filename else ""
            _fail(f"{e.strerror or 'no space left'}{where}; files finished before are intact "
                  f"(every output is written to a temp file and renamed). Free space and run the same command again")
        finally:
            release_process_group()

    return wrapper


def release_process_group() -> None:
    """Destroy the job's ``torch.distributed`` group (DDP ranks) once the job is over: gloo threads
    left to the interpreter's teardown can abort a finished process (SIGABRT)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

"""Job entry points: a user error is one line and exit status 2, never a traceback, and a job
leaves no DDP process group behind.

``cli_errors`` wraps every console script's ``main``: a ``CaptioningError`` (or a full disk) prints
``error: <one line>`` and exits with status 2; inside a Hydra sweep it raises ``JobFailed`` instead,
so the sweep records that job as failed and goes on with the others.  When the job ends, the
``torch.distributed`` group it made (DDP ranks) is destroyed (``release_process_group``).
``composition_errors`` wraps a ``@hydra.main`` entry point: a config that does not compose (a
misspelt key, a value of the wrong type, an unknown option of a group) is one line and status 2 too.
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

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


def one_line(error: BaseException) -> str:
    """A composition error of Hydra (and its OmegaConf cause) as one line: an unknown key is named
    as such (``unknown config key 'optim.lrr' (Key 'lrr' not in 'OptimConfig')``), anything else is
    Hydra's message with its cause's first line (a list of a group's options joined with commas)."""
    cause = error.__cause__
    reason = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
        return (f"unknown config key '{cause.full_key}' ({reason}): check its spelling "
                f"(--cfg job prints the composed config with every key)")
    lines = [line.strip() for line in str(error).split("Config search path:")[0].splitlines() if line.strip()]
    text, listing = (lines[0] if lines else type(error).__name__), False
    for line in lines[1:]:  # e.g. "Available options in 'model':" and one option a line
        listing = listing or text.endswith(":")
        text += (" " if text.endswith(":") else ", " if listing else ". ") + line
    return text + (f": {reason}" if reason else "")


def composition_errors(main: Callable[[], Any]) -> Callable[[], Any]:
    """Decorator for a ``@hydra.main`` entry point: a config that does not compose against its
    schema (Hydra's ``CompactHydraException``: an unknown key, a wrong type, an unknown group
    option, an override that does not parse) prints ``error: <one line>`` naming the key and exits
    with status 2, as ``cli_errors`` does for the job's own errors, instead of Hydra's multi-line
    report (status 1).  Hydra hands the exception on when ``HYDRA_FULL_ERROR`` is set, which this
    does for the call; set it yourself for Hydra's full report."""

    @functools.wraps(main)
    def entry(*args: Any, **kwargs: Any) -> Any:
        previous = os.environ.get("HYDRA_FULL_ERROR")
        if previous == "1":  # Hydra's full report asked for
            return main(*args, **kwargs)
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            return main(*args, **kwargs)
        except CompactHydraException as e:
            print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
            sys.exit(2)
        finally:
            if previous is None:
                os.environ.pop("HYDRA_FULL_ERROR", None)
            else:
                os.environ["HYDRA_FULL_ERROR"] = previous

    return entry


def release_process_group() -> None:
    """Destroy the job's ``torch.distributed`` group (DDP ranks) once the job is over: gloo threads
    left to the interpreter's teardown can abort a finished process (SIGABRT)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

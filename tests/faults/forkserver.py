"""Run CLI jobs as fresh processes forked from one that imported their modules once.

A CLI process spends ~10 s of CPU importing torch, Lightning and torchvision before it parses
its arguments; the fault suite runs dozens of short, deliberately killed jobs, so it starts them
the way a pre-forking server does.  The server (this file, run as a script) imports the modules
once, runs no computation (so no OpenMP thread pool exists yet), and for every request forks a child that
is an ordinary OS process with its own pid: it redirects its stdout/stderr to files, sets the
requested environment, installs the fault injection and probes of ``inject/sitecustomize.py``
from that environment, and runs ``captioning.cli.<job>`` as ``__main__`` with ``runpy`` -- what
``python -m captioning.cli.<job> args...`` does -- then exits with the job's status.  A SIGKILL
kills that child for real, and its exit status is reported as ``-9`` like ``subprocess`` does.
DDP jobs are not run here (Lightning relaunches their ranks as new interpreters anyway).

Protocol: one JSON request per line on stdin (``module``, ``args``, ``env``, ``cwd``, ``out``,
``timeout``), one JSON answer per line on stdout (``returncode``).
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
INJECT = HERE / "inject"
PRELOAD = (
    "torch", "numpy", "pytorch_lightning", "hydra", "timm", "matplotlib", "matplotlib.pyplot",
    "captioning.cli.train", "captioning.cli.extract", "captioning.cli.evaluate", "captioning.train.module",
    "captioning.features.extract", "captioning.features.backbones", "captioning.features.backbones.timm_models",
    "captioning.features.backbones.torchvision_cnns", "captioning.data.datamodule",
    "captioning.data.annotations", "captioning.metrics", "captioning.evaluation.report",
    "captioning.evaluation.grounding", "captioning.train.checkpoint",
)


# ------------------------------------------------------------------------------ server


def _child(request: dict) -> None:
    """In the forked child: become the requested job; never returns."""
    import runpy

    code = 1
    try:
        out = request["out"]
        for fd, suffix in ((1, ".stdout"), (2, ".stderr")):
            target = os.open(out + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.setpgid(0, 0)
        for key, value in request["env"].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.chdir(request["cwd"])
        sys.argv = [request["module"], *request["args"]]
        import sitecustomize  # the fault suite's: installs what the environment asks for

        sitecustomize.install_from_environment()
        sys.modules.pop(request["module"], None)  # preloaded: run it afresh as __main__, as -m does
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import logging

            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    for name in PRELOAD:  # only to save time: a module that moved is imported by the job itself
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    answers = os.fdopen(os.dup(1), "w")
    print(json.dumps({"ready": os.getpid()}), file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline = time.monotonic() + float(request.get("timeout", 600))
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.02)
        code = 124 if status is None else os.waitstatus_to_exitcode(status)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        print(json.dumps({"returncode": code, "cpu": cpu}), file=answers, flush=True)


# ------------------------------------------------------------------------------ client


class ForkServer:
    """Client: ``run(job, *args, env=...)`` -> ``subprocess.CompletedProcess`` (text stdout/stderr)."""

    def __init__(self, repo: Path, scratch: Path) -> None:
        self.repo = repo
        self.scratch = scratch
        self.count = 0
        self.cpu_seconds = 0.0  # CPU time of the jobs run so far (children only)
        self.lock = threading.Lock()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(INJECT), os.environ.get("PYTHONPATH")]))}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        for key in ("CAPTIONING_FAULT", "CAPTIONING_PROBE_DIR"):
            env.pop(key, None)
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], cwd=repo, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the fork server did not start")

    def run(self, job: str, *args: str, env: dict | None = None, check: bool = True,
            timeout: int = 600) -> subprocess.CompletedProcess:
        with self.lock:
            self.count += 1
            out = str(self.scratch / f"job{self.count:03d}")
            request = {"module": f"captioning.cli.{job}", "args": list(args), "env": dict(env or {}),
                       "cwd": str(self.repo), "out": out, "timeout": timeout}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the fork server died running {job} {args}")
        answer = json.loads(answer)
        code = answer["returncode"]
        self.cpu_seconds += answer["cpu"]
        stdout = Path(out + ".stdout").read_text(errors="replace")
        stderr = Path(out + ".stderr").read_text(errors="replace")
        proc = subprocess.CompletedProcess([job, *args], code, stdout, stderr)
        if check and code != 0:
            raise AssertionError(f"{job} {' '.join(args)} exited {code}\n--- stdout\n{stdout[-4000:]}\n"
                                 f"--- stderr\n{stderr[-6000:]}")
        return proc

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


if __name__ == "__main__":
    _serve()

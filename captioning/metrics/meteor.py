"""METEOR: the COCO caption toolkit's METEOR 1.5 jar (``-l en -norm``), run through Java."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from captioning.metrics import METRICS, MetricError, Scored
from captioning.metrics.ngrams import Shared, Tokens, check_lengths


def meteor_jar() -> Path:
    """Path of pycocoevalcap's bundled ``meteor-1.5.jar``."""
    spec = importlib.util.find_spec("pycocoevalcap")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        jar = Path(root) / "meteor" / "meteor-1.5.jar"
        if jar.is_file():
            return jar
    raise MetricError(
        "METEOR needs pycocoevalcap's meteor-1.5.jar: pip install 'captioning[eval]' "
        "(or drop meteor from metrics)"
    )


def _meteor_clean(tokens: Tokens) -> str:
    return " ".join(tokens).replace("|||", "").replace("  ", " ")


def meteor(
    hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], timeout: float = 600.0
) -> tuple[float, list[float]]:
    """(corpus, per-item) METEOR 1.5 via the toolkit's jar (``-stdio -l en -norm``); needs Java."""
    check_lengths(hypotheses, references)
    if not hypotheses:
        return float("nan"), []
    java = shutil.which("java")
    if java is None:
        raise MetricError(
            "METEOR needs Java (the toolkit's meteor-1.5.jar): install a JRE (e.g. apt-get install "
            "default-jre-headless) or drop meteor from metrics, e.g. metrics=[bleu,rouge,cider]"
        )
    jar = meteor_jar()
    cmd = [java, "-Xmx2G", "-Duser.language=en", "-Duser.country=US", "-jar", str(jar),
           "-", "-", "-stdio", "-l", "en", "-norm"]  # fmt: skip
    lines = [
        " ||| ".join(("SCORE", " ||| ".join(_meteor_clean(r) for r in refs), _meteor_clean(hyp)))
        for hyp, refs in zip(hypotheses, references, strict=True)
    ]
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=str(jar.parent),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as e:
        raise MetricError(f"cannot start Java for METEOR ({java}): {e}") from e
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err_chunks: list[bytes] = []
    err_thread = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    err_thread.start()

    def write_all() -> None:
        try:
            for line in lines:
                proc.stdin.write((line + "\n").encode("utf-8"))
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        writer = threading.Thread(target=write_all, daemon=True)
        writer.start()
        stats = []
        for _ in lines:
            out = proc.stdout.readline()
            if not out:
                break
            stats.append(out.decode("utf-8").strip())
        writer.join()
        if len(stats) != len(lines):
            raise MetricError(_meteor_failure(proc, err_thread, err_chunks))
        proc.stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode("utf-8"))
        proc.stdin.flush()
        values = []
        for _ in range(len(lines) + 1):
            out = proc.stdout.readline()
            if not out:
                raise MetricError(_meteor_failure(proc, err_thread, err_chunks))
            values.append(float(out.decode("utf-8").strip()))
        proc.stdin.close()
        proc.wait(timeout=60)
    except (BrokenPipeError, ValueError) as e:
        raise MetricError(f"METEOR jar returned unexpected output: {e}") from e
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return values[-1], values[:-1]


def _meteor_failure(proc: subprocess.Popen, err_thread: threading.Thread, chunks: list) -> str:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    err_thread.join(timeout=5)
    msg = b"".join(chunks).decode("utf-8", "replace").strip().splitlines()
    detail = msg[-1] if msg else f"exit status {proc.returncode}"
    return f"METEOR jar failed: {detail}"


@METRICS.register("meteor", keys=("METEOR",), default=True)
def score_meteor(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], shared: Shared) -> Scored:
    corpus, items = meteor(hypotheses, references)
    return Scored(scores={"METEOR": corpus}, per_item={"METEOR": items})

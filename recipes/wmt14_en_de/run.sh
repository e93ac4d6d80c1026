#!/usr/bin/env bash
# WMT14 English->German as in "Attention Is All You Need": ARCH=base|big, GPUS=N, DATA_DIR=..., WORK_DIR=...
# DRY_RUN=1 prints the commands; SMOKE=1 runs the whole chain on a slice of ../shared/data on a CPU.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for step in "$here"/0*.sh; do bash "$step"; done

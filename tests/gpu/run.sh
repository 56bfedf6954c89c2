#!/usr/bin/env bash
# The GPU proof in one command, on the GPU machine: tools/gpu/run.sh says what it installs and runs.
exec bash "$(dirname "$0")/../../tools/gpu/run.sh" "$@"

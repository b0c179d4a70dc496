#!/usr/bin/env bash
# mypy --strict over the whole Python package (issue 20), with the
# settings in python/pyproject.toml ([tool.mypy]: strict; calls into the
# generated, unannotated *_pb2_grpc stubs allowed; google.rpc's .pyi files
# read; the generated rlhub._proto modules themselves exempt). The package
# must stay clean: a new module is checked the day it lands.
set -euo pipefail
cd "$(dirname "$0")/../../python"
python3 -m mypy --strict --no-incremental rlhub

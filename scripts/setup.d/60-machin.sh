# Sourced by scripts/setup.sh. The learner-loop benchmark's reference arm
# (issue 18): Machin 0.4.2's PushPullGradServer, installed apart from the
# project's Python packages into .cache/machin (about 4 MB, a few seconds;
# nothing when present). python/tests/test_bench_machin.py runs that arm.
scripts/setup_machin.sh

#!/bin/bash
# xla_compat on a TPU (the `device` tool's tpu-v5e machine: JAX on the chip, no network, torch from
# its local wheels). Run from the repository root there: bash benchmarks/tpu_run.sh
# Writes into $OUT: tpu_check.txt, tpu_demo_{legacy,functional}.txt, tpu_bench.md, tpu_tests.txt.
REPO=$PWD
DEPS=/tmp/deps
OUT=${OUT:-/tmp/tpu_out}
mkdir -p "$OUT"
PIP="env PIP_CONFIG_FILE=/dev/null python3 -m pip install -q --isolated --index-url file:///opt/pypi/simple --target $DEPS"
[ -d $DEPS/torch ] || $PIP --only-binary=:all: torch==2.13.0 --find-links /opt/wheels
$PIP --only-binary=:all: wrapt packaging expecttest
$PIP --no-deps .              # (a real install: the path packages live in legacy/ and functional/)
export PYTHONPATH=$PYTHONPATH:$DEPS:$REPO
cd /tmp                       # (the checkout's xla_compat/ would shadow the installed package)
cp "$REPO/benchmarks/tpu_check.py" /tmp/tpu_check.py
timeout 200 python3 /tmp/tpu_check.py 2>&1 | tail -3 | tee "$OUT/tpu_check.txt"
for path in legacy functional; do
    timeout 150 python3 -m xla_compat.demo --steps 10 --dual-run strict --dual-run-steps 2 \
        --path $path --checkpoint-dir /tmp/ck_$path 2>&1 | tail -8 | tee "$OUT/tpu_demo_$path.txt"
done
timeout 200 python3 "$REPO/benchmarks/run.py" --quick --passes 1 --out "$OUT/tpu_bench.md" | tail -4
timeout 330 python3 -m pytest -q --import-mode=append -p no:cacheprovider -m "not slow" \
    "$REPO/tests/test_training.py" "$REPO/tests/test_capture.py" "$REPO/tests/test_dualrun_lockstep.py" \
    "$REPO/tests/lowering/test_nn_training.py" "$REPO/tests/test_fused_optim.py" 2>&1 | tail -25 \
    | tee "$OUT/tpu_tests.txt"

PY      := .venv/bin/python
PIP     := .venv/bin/pip
JOBS    ?= 2
CAP     ?= 8

.PHONY: demo test test-slow conformance conformance-grads bench fuzz clean

# pip byte-compiles what it installs one file at a time; compileall does it on every core (80 ->
# 50 s on 2 cores). The .pyc files matter where PYTHONDONTWRITEBYTECODE is set (CI): nothing
# writes them at import there, and torch and jax import in 6 s instead of 2.5 without them.
# (One torch test helper is written in Python 3.12's syntax; pip skips it too.)
.venv: constraints.txt pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --no-compile -c constraints.txt torch==2.13.0
	$(PIP) install -q --no-compile -c constraints.txt -e '.[test]'
	$(PY) -m compileall -q -j 0 -x py312_intrinsics .venv/lib > /dev/null
	touch .venv

demo: .venv
	$(PY) -m xla_compat.demo

test: .venv
	$(PY) -m pytest -q -n $(JOBS) -m "not slow" tests

# What make test leaves out: the rest of the cross products it samples (tests/sampling.py) and
# the long runs (marked slow).
test-slow: .venv
	$(PY) -m pytest -q -n $(JOBS) -m slow tests

conformance: .venv
	$(PY) -m tests.conformance.run --full --paths legacy,functional --cap $(CAP) --jobs $(JOBS)

# Gradients of the OpInfo samples (conformance compares forward results only).
conformance-grads: .venv
	$(PY) -m tests.conformance.grads --paths legacy,functional --out tests/conformance/GRADS.md

fuzz: .venv
	$(PY) -m tests.fuzz.run --examples 20000 --out tests/fuzz/LAST_RUN.md

bench: .venv
	$(PY) benchmarks/run.py --passes 4 --out benchmarks/RESULTS.md

clean:
	rm -rf .venv build *.egg-info

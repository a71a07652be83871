# One obvious way to run things. Every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
LINT_STAMP := $(VENV)/.installed-lint

.PHONY: all demo test test-unit test-e2e test-hardening test-tools test-pyverbs test-native \
        lint lint-docker images bench bench-engine clean provider native-packages \
        accel accel-packages

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# setuptools reports every editable install of a package-dir mapping like ours (five
# folders installed as softhca.<folder>) with an "Editable installation" notice, a
# warning category although nothing is wrong; the filter keeps only that notice out.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

$(STAMP): $(PY) pyproject.toml
	$(QUIET_EDITABLE) $(PY) -m pip install --quiet -e '.[fast,test]'
	touch $(STAMP)

# The docker/ linters (check-jsonschema, hadolint from its wheel), only for `make lint`.
$(LINT_STAMP): $(STAMP) pyproject.toml
	$(QUIET_EDITABLE) $(PY) -m pip install --quiet -e '.[fast,test,lint]'
	touch $(LINT_STAMP)

demo: $(STAMP)
	$(VENV)/bin/softhca demo

# Everything, as CI runs it (.ci/run): every folder of tests/, each kind marked. softhca's
# modules are byte-compiled first: the tests start hundreds of `softhca` processes, and
# where PYTHONDONTWRITEBYTECODE is set (as in many CI images) each would otherwise
# compile every module it imports again, some 30% more CPU a start (Python still checks
# each .pyc against its source, so a stale one is never used).
BYTECODE := softhca engine protocol server client tools
test: $(STAMP) provider accel
	$(PY) -m compileall -q -j 0 $(BYTECODE)
	$(PY) -m pytest -q

# The libibverbs provider (provider/) and the Debian packages that build and judge it:
# libibverbs-dev (headers, libibverbs), ibverbs-utils (ibv_devinfo, ibv_rc_pingpong),
# perftest (ib_write_bw ...); ucx-utils (ucx_perftest: `softhca bench`'s UCX peer);
# libfabric-bin (fi_pingpong) and qperf, middleware tests/native runs unchanged.
# Installed when missing and root (CI is); otherwise the provider is skipped with a note
# and tests/native skips, saying why (and the bench notes that it has no UCX peer).
NATIVE_PKGS := libibverbs-dev ibverbs-utils perftest librdmacm-dev rdmacm-utils ucx-utils \
               libfabric-bin qperf tgt libiscsi-bin libiscsi-dev
native-packages: PKGS := $(NATIVE_PKGS)
native-packages: WHO := provider
native-packages: WITHOUT := tests/native will skip, saying why

# The provider, then the MKEY examples in C (examples/c), which tests/native runs on it.
provider: native-packages
	@if [ -e /usr/include/infiniband/verbs.h ]; then $(MAKE) -s -C provider; \
	else echo "provider: no <infiniband/verbs.h>; not built"; fi
	@if [ -e /usr/include/infiniband/mlx5dv.h ]; then $(MAKE) -s -C examples/c; \
	else echo "examples/c: no <infiniband/mlx5dv.h>; not built"; fi

# The engine's native accelerator (accel/): softhca.accel._native, built for the venv's
# Python, with ISA-L's CRCs (libisal-dev) and OpenSSL (libssl-dev), installed when missing
# and root (CI is). Without them the engine runs its Python path, saying so in
# `softhca bench engine`; with CI=true the tests fail instead (tests/unit/conftest.py).
ACCEL_PKGS := libisal-dev libssl-dev
accel-packages: PKGS := $(ACCEL_PKGS)
accel-packages: WHO := accel
accel-packages: WITHOUT := the engine keeps its Python path

# One recipe for both lists above: the packages of PKGS that dpkg does not have, installed
# when root and apt-get is there; otherwise (or when apt-get fails) one line saying so, WHO
# naming the component and WITHOUT what happens without them.
native-packages accel-packages:
	@missing=""; for p in $(PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing$$missing"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; } \
	      || echo "$(WHO): could not install$$missing ($(WITHOUT))"; \
	  else echo "$(WHO): missing$$missing (not root: not installed; $(WITHOUT))"; fi; \
	fi

accel: $(STAMP) accel-packages
	@if [ -e /usr/include/isa-l/crc.h ] && [ -e /usr/include/openssl/evp.h ]; then \
	  $(MAKE) -s -C accel PY=$(abspath $(PY)); \
	else echo "accel: no <isa-l/crc.h> or <openssl/evp.h>; not built (the engine runs in Python)"; fi

# One kind of test, its folder of tests/ (README, "Tests"); test-unit is seconds, no daemon.
test-unit test-e2e test-hardening test-tools test-pyverbs: test-%: $(STAMP) accel
	$(PY) -m pytest -q tests/$*

# rdma-core's tests from v55 on ask iproute2's rdma, which the preload library answers.
test-pyverbs: provider

test-native: $(STAMP) provider
	$(PY) -m compileall -q -j 0 $(BYTECODE)
	$(PY) -m pytest -q tests/native

lint: $(STAMP) lint-docker
	$(PY) -m ruff check softhca engine protocol server client tools tests examples

# Offline: the compose file against the compose specification schema check-jsonschema
# carries, the Dockerfile with hadolint at warning level.
lint-docker: $(LINT_STAMP)
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml
	$(VENV)/bin/hadolint --failure-threshold warning docker/Dockerfile
	@echo "hadolint: docker/Dockerfile ok (failure threshold: warning)"

# softhca:daemon and softhca:tests with no container registry: the base is python:3.11-slim-bookworm
# when the engine has it or can pull it, else a debootstrapped Debian bookworm; the wheels
# are built here; each step cached by a hash of its inputs (docker/README.md).
# What two checkouts on one Docker engine must not share: the images' repository
# (SOFTHCA_IMAGE:daemon, SOFTHCA_IMAGE:tests), the compose network's /24 (its first three
# octets: the target at .1, the initiator at .2) and the compose project. `make images
# test SOFTHCA_IMAGE=mine SOFTHCA_SUBNET=10.201.0 SOFTHCA_PROJECT=mine` (or the same
# environment variables) for a second checkout; docker/compose.yaml, docker/build-images.sh
# and tests/support/compose.py read them.
SOFTHCA_IMAGE ?= softhca
SOFTHCA_SUBNET ?= 10.200.0
SOFTHCA_PROJECT ?= softhca-twonode
export SOFTHCA_IMAGE SOFTHCA_SUBNET SOFTHCA_PROJECT

images: $(STAMP) provider accel
	PY=$(PY) bash docker/build-images.sh

bench-engine: $(STAMP) accel
	$(VENV)/bin/softhca bench engine

# Two daemons end to end, each figure beside its ceilings (docs/performance.md); about a
# minute. BENCH_ARGS passes options through, e.g. BENCH_ARGS="--json" or "--quick".
bench: $(STAMP) accel
	$(VENV)/bin/softhca bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
	$(MAKE) -s -C provider clean
	$(MAKE) -s -C accel clean
	$(MAKE) -s -C examples/c clean

#!/usr/bin/env bash
# make images: softhca's two images (softhca:daemon, softhca:tests) with no container
# registry. Each step is cached by a hash of its inputs, so a second run only checks.
# SOFTHCA_IMAGE names another repository for the two tags (SOFTHCA_IMAGE:daemon,
# SOFTHCA_IMAGE:tests), for a second checkout on the same engine.
#
#   1. the base: PYTHON_IMAGE (default python:3.11-slim-bookworm) if the engine has it or can pull
#      it; otherwise a Debian bookworm root filesystem made with debootstrap (python3,
#      python3-venv) and loaded with `docker import` as softhca-base:bookworm;
#   2. the wheelhouse: softhca's wheel (with the native accelerator `make accel` built in
#      accel/) and every dependency of its fast and test extras,
#      built on the host into build/wheelhouse (crcmod has only an sdist: its wheel is
#      built here, so the image needs no compiler);
#   3. docker/Dockerfile's daemon and tests stages, installing softhca only from the
#      wheelhouse, with the provider `make provider` built on the host (provider/build)
#      and Debian's ibverbs-utils, perftest and the middleware (UCX, libfabric, qperf, tgt,
#      libiscsi) from the Debian archive.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
WANT_BASE=${PYTHON_IMAGE:-python:3.11-slim-bookworm}
DEBIAN_BASE=softhca-base:bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ROOTFS_DIR=${ROOTFS_DIR:-/var/tmp/softhca-rootfs}
WHEELHOUSE=build/wheelhouse
IMAGE=${SOFTHCA_IMAGE:-softhca}

say() { echo "images: $*"; }
label() { docker image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }
hash_files() { sha256sum "$@" | sha256sum | cut -c1-16; }

# -- 1. the base image ------------------------------------------------------------------
base_recipe=$(printf 'debootstrap --variant=minbase --include=python3,python3-venv bookworm %s\n' \
    "$DEBIAN_MIRROR" | sha256sum | cut -c1-16)
if docker image inspect "$WANT_BASE" >/dev/null 2>&1; then
    base=$WANT_BASE; say "base $base (already in the engine)"
elif timeout 30 docker pull -q "$WANT_BASE" >/dev/null 2>&1; then
    base=$WANT_BASE; say "base $base (pulled)"
elif [ "$(label "$DEBIAN_BASE" softhca.recipe)" = "$base_recipe" ]; then
    base=$DEBIAN_BASE; say "base $base (debootstrap bookworm, cached; $WANT_BASE cannot be had)"
else
    say "$WANT_BASE cannot be had (no registry): making $DEBIAN_BASE with debootstrap"
    if ! command -v debootstrap >/dev/null; then
        [ "$(id -u)" = 0 ] || { echo "images: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
        apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
    fi
    rm -rf "$ROOTFS_DIR" && mkdir -p "$ROOTFS_DIR"
    start=$(date +%s)
    debootstrap --variant=minbase --include=python3,python3-venv bookworm \
        "$ROOTFS_DIR/rootfs" "$DEBIAN_MIRROR" >"$ROOTFS_DIR/debootstrap.log" 2>&1 \
        || { tail -20 "$ROOTFS_DIR/debootstrap.log" >&2; exit 1; }
    rm -rf "$ROOTFS_DIR"/rootfs/var/cache/apt/archives/*.deb "$ROOTFS_DIR"/rootfs/var/lib/apt/lists/*
    tar -C "$ROOTFS_DIR/rootfs" -c . | docker import \
        --change "LABEL softhca.recipe=$base_recipe" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$DEBIAN_BASE" >/dev/null
    rm -rf "$ROOTFS_DIR"
    base=$DEBIAN_BASE; say "base $base (debootstrap bookworm, made in $(( $(date +%s) - start )) s)"
fi
base_id=$(docker image inspect --format '{{.Id}}' "$base")

# -- 2. the wheelhouse ------------------------------------------------------------------
mapfile -t sources < <(find pyproject.toml README.md accel engine protocol server client tools \
    -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | LC_ALL=C sort)
wheel_inputs=$(hash_files "${sources[@]}")
# A copy of each wheelhouse built, outside the checkout, by the hash of its inputs: a fresh
# clone of the same sources takes it instead of building it again (pip wheel is most of a
# minute, mostly the package index), and the same wheel files keep Docker's COPY of them,
# and the venv layers after it, cached. The three most recent are kept.
WHEEL_CACHE=${SOFTHCA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/softhca-wheelhouse}
if [ -f "$WHEELHOUSE/.inputs" ] && [ "$(cat "$WHEELHOUSE/.inputs")" = "$wheel_inputs" ]; then
    say "wheelhouse $WHEELHOUSE up to date"
elif [ -f "$WHEEL_CACHE/$wheel_inputs/.inputs" ]; then
    rm -rf "$WHEELHOUSE" && mkdir -p "$(dirname "$WHEELHOUSE")"
    cp -a "$WHEEL_CACHE/$wheel_inputs" "$WHEELHOUSE"
    touch "$WHEEL_CACHE/$wheel_inputs"
    say "wheelhouse $WHEELHOUSE from $WHEEL_CACHE/$wheel_inputs ($(ls "$WHEELHOUSE"/*.whl | wc -l) wheels)"
else
    rm -rf "$WHEELHOUSE" && mkdir -p "$WHEELHOUSE"
    "$PY" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELHOUSE" '.[fast,test]'
    echo "$wheel_inputs" >"$WHEELHOUSE/.inputs"
    say "wheelhouse $WHEELHOUSE built ($(ls "$WHEELHOUSE"/*.whl | wc -l) wheels)"
    if mkdir -p "$WHEEL_CACHE" 2>/dev/null; then
        part=$(mktemp -d "$WHEEL_CACHE/.part.XXXXXX")
        cp -a "$WHEELHOUSE/." "$part/" && { mv -T "$part" "$WHEEL_CACHE/$wheel_inputs" 2>/dev/null \
            || rm -rf "$part"; }
        # shellcheck disable=SC2012  # names are hashes
        ls -1t "$WHEEL_CACHE" | tail -n +4 | while read -r old; do rm -rf "${WHEEL_CACHE:?}/$old"; done
    fi
fi

# -- 3. the images ----------------------------------------------------------------------
PROVIDER=provider/build/libsofthca-rdmav34.so
LIBMLX5=provider/build/libmlx5.so.1
LIBRDMACM=provider/build/librdmacm.so.1
PRELOAD=provider/build/libsofthca-preload.so
ISCSICHECK=provider/build/iscsicheck
for f in "$PROVIDER" "$LIBMLX5" "$LIBRDMACM" "$PRELOAD"; do
    [ -f "$f" ] || { echo "images: no $f: \`make provider\` builds it (libibverbs-dev)" >&2; exit 1; }
done
[ -f "$ISCSICHECK" ] || { echo "images: no $ISCSICHECK: \`make provider\` builds it (libiscsi-dev)" >&2; exit 1; }
mapfile -t tests < <(find tests -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | LC_ALL=C sort)
image_inputs=$( { echo "$base_id"; cat "$WHEELHOUSE/.inputs"; hash_files docker/Dockerfile docker/softhca-node .dockerignore pyproject.toml "$PROVIDER" "$LIBMLX5" "$LIBRDMACM" "$PRELOAD" "$ISCSICHECK" "${tests[@]}"; } | sha256sum | cut -c1-16)
# Each image's inputs are recorded beside the checkout (build/images/), with the image id
# they made, not as a label: the classic builder adds a label as one more step after the
# last, which on a storage driver with no native diff (fuse-overlayfs) costs a commit of
# the whole image (docker/Dockerfile says more).
STATE=build/images
mkdir -p "$STATE"
for stage in daemon tests; do
    record="$STATE/$(printf '%s' "$IMAGE" | tr -c 'A-Za-z0-9._-' '_').$stage"
    have=$(docker image inspect --format '{{.Id}}' "$IMAGE:$stage" 2>/dev/null || true)
    if [ -n "$have" ] && [ -f "$record" ] && [ "$(cat "$record")" = "$have $image_inputs" ]; then
        say "$IMAGE:$stage up to date (inputs $image_inputs)"
        continue
    fi
    start=$(date +%s)
    rm -f "$record"
    docker build --quiet -f docker/Dockerfile --target "$stage" \
        --build-arg "PYTHON_IMAGE=$base" -t "$IMAGE:$stage" . >/dev/null
    # SOFTHCA_ENGINE=native in both images: one without the accelerator fails here, not in
    # a test (a container run, not a build step: nothing to commit).
    engine=$(docker run --rm --network none --entrypoint python3 "$IMAGE:$stage" -c \
        "from softhca.engine import backend; print(backend.name())") \
        || { echo "images: $IMAGE:$stage has no working engine (above)" >&2; exit 1; }
    echo "$(docker image inspect --format '{{.Id}}' "$IMAGE:$stage") $image_inputs" >"$record"
    say "$IMAGE:$stage built on $base in $(( $(date +%s) - start )) s (engine $engine; inputs $image_inputs)"
done

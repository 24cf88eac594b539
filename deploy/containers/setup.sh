#!/usr/bin/env bash
# The container engine and the local images of `make test-containers`, as the project's own steps.
#
# No image registry is reachable from the machines this project is tested on, so every image is made here:
#   1. podman + runc (+ debootstrap) from Debian's packages (root and apt-get needed, else exit 3 saying so);
#   2. var/containers/containers.conf (CONTAINERS_CONF): runc (crun fails on this kernel's cgroup mode),
#      cgroupfs, and default ulimits at the host's hard limits (podman's defaults ask for more: refused);
#   3. localhost/debian-standin:bookworm         debootstrap --variant=minbase bookworm, `podman import`ed;
#      localhost/python-standin:3.11-slim-bookworm  deploy/containers/python: that + Debian's python3.11
#                                                  and pip, a STAND-IN for python:3.11-slim-bookworm, the
#                                                  Dockerfile's default base;
#   4. localhost/apache-kafka-standin:4.1.1       deploy/containers/kafka: the broker jars of var/jvm/broker
#                                                  + Debian's JRE; a STAND-IN for apache/kafka:4.1.1;
#   5. localhost/prometheus-standin:bookworm      Debian's prometheus package (older than prom/prometheus
#                                                  v2.55.1 of the compose file): a STAND-IN for it;
#   6. localhost/source-backfill:local            the project's Dockerfile, unchanged, with
#                                                  --build-arg BASE_IMAGE=<the python stand-in>.
# Each image is built once and kept (podman's store, /var/lib/containers), so a second run takes seconds;
# SOURCE_BACKFILL_REBUILD=1 rebuilds the last two. Usage: deploy/containers/setup.sh [env-file]
# writes the settings the tests need (CONTAINERS_CONF, the image names) to env-file (default
# var/containers/env), one KEY=VALUE a line.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
STATE="$ROOT/var/containers"
ENV_FILE="${1:-$STATE/env}"
RELEASE=bookworm            # the Debian release of the Dockerfile's base (python:3.11-slim-bookworm)
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' deploy/jvm/pom.xml)"
DEBIAN_IMG=localhost/debian-standin:$RELEASE
PYTHON_IMG=localhost/python-standin:3.11-slim-$RELEASE
KAFKA_IMG=localhost/apache-kafka-standin:$KAFKA_VERSION
PROM_IMG=localhost/prometheus-standin:$RELEASE
APP_IMG=localhost/source-backfill:local
mkdir -p "$STATE"
log() { echo "containers-setup: $*" >&2; }
t0=$(date +%s)

# 1. the engine
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
# netavark (+ iptables, which it drives) for the containers' bridge networks, aardvark-dns for their names
for p in uidmap slirp4netns fuse-overlayfs netavark aardvark-dns iptables; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "needs root and apt-get to install ${need[*]} (Debian packages); the container tests skip"
    exit 3
  fi
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [ "$(id -u)" != 0 ]; then
  log "rootful podman needs root (the images live in /var/lib/containers); the container tests skip"
  exit 3
fi

# 2. the engine's settings: this project's file, not the machine's
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nproc" = unlimited ] && nproc=4194304
# runc refuses an nproc above kernel.pid_max here (measured: 32768 starts, 65536 "error setting rlimit
# type 6: operation not permitted" although the hard limit is 96365)
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
[ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
cat >"$STATE/containers.conf" <<CONF
# Written by deploy/containers/setup.sh (CONTAINERS_CONF points here); do not edit by hand.
[containers]
# podman's default nofile/nproc ask for more than this host allows, and runc refuses the container:
# the host's hard limits (nproc at most kernel.pid_max). podman build takes --ulimit instead.
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
log_driver = "k8s-file"

[network]
network_backend = "netavark"

[engine]
# crun fails on this kernel's cgroup mode; runc works.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
export CONTAINERS_CONF="$STATE/containers.conf"
{
  echo "CONTAINERS_CONF=$CONTAINERS_CONF"
  echo "SOURCE_BACKFILL_TEST_DEBIAN_IMAGE=$DEBIAN_IMG"
  echo "SOURCE_BACKFILL_TEST_PYTHON_IMAGE=$PYTHON_IMG"
  echo "SOURCE_BACKFILL_KAFKA_IMAGE=$KAFKA_IMG"
  echo "SOURCE_BACKFILL_TEST_PROMETHEUS_IMAGE=$PROM_IMG"
  echo "SOURCE_BACKFILL_TEST_APP_IMAGE=$APP_IMG"
} >"$ENV_FILE"

has() { podman image exists "$1"; }
timed() { local s=$(date +%s); "$@"; log "$(( $(date +%s) - s ))s: ${*:1:3}"; }

# 3. the base images, from Debian's packages
rootfs_image() {  # name, extra packages
  local name=$1 include=$2 dir
  dir=$(mktemp -d "$STATE/rootfs.XXXXXX")
  log "debootstrap $RELEASE -> $name"
  debootstrap --variant=minbase ${include:+--include="$include"} "$RELEASE" "$dir" >"$STATE/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap.log" >&2; rm -rf "$dir"; return 1; }
  # a slim image: no apt lists or caches (as Debian's images); man/doc folders stay (openjdk's
  # update-alternatives links into /usr/share/man/man1 and fails without it)
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb \
         "$dir"/usr/share/locale/*
  # the machine's own added CA certificates (a TLS-inspecting proxy's, say), trusted as the host trusts
  # them, so the image builds' pip, apt and Maven reach their indexes from here as the host does
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
    chroot "$dir" update-ca-certificates >/dev/null 2>&1
  fi
  tar -C "$dir" -c . | podman import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' - "$name" >/dev/null 2>&1
  rm -rf "$dir"
}
has "$DEBIAN_IMG" || timed rootfs_image "$DEBIAN_IMG" "ca-certificates"

build() {  # image, context, [podman build args...]
  local name=$1 ctx=$2; shift 2
  local blog="$STATE/build-$(echo "$name" | tr '/:' '__').log"
  log "building $name (log: $blog)"
  # --ulimit: podman build does not take containers.conf's default_ulimits for its RUN steps
  podman build --format docker --network host --ulimit "nofile=$nofile:$nofile" \
      --ulimit "nproc=$nproc:$nproc" -t "$name" "$@" "$ctx" >"$blog" 2>&1 \
    || { tail -30 "$blog" >&2; return 1; }
}
rebuild=${SOURCE_BACKFILL_REBUILD:-0}

# the Python stand-in on the Debian one (one debootstrap, not two)
has "$PYTHON_IMG" || timed build "$PYTHON_IMG" deploy/containers/python --build-arg "BASE_IMAGE=$DEBIAN_IMG"

# 4. Kafka: the pinned broker jars (make jars) + Debian's JRE
if ! has "$KAFKA_IMG" || [ "$rebuild" = 1 ]; then
  broker_jars="${SOURCE_BACKFILL_JARS:-$ROOT/var/jvm}/broker"
  [ -d "$broker_jars" ] || { log "no broker jars in $broker_jars: run make jars"; exit 1; }
  ctx=$(mktemp -d "$STATE/kafka-ctx.XXXXXX")
  cp -r deploy/containers/kafka/. "$ctx/"
  tools="$STATE/kafka-tools-$KAFKA_VERSION"   # the command-line tools' jar, same version, from Maven
  if [ ! -f "$tools/kafka-tools-$KAFKA_VERSION.jar" ]; then
    mvn -q -B -f deploy/jvm/pom.xml dependency:copy "-Dartifact=org.apache.kafka:kafka-tools:$KAFKA_VERSION" \
        "-DoutputDirectory=$tools" >"$STATE/mvn.log" 2>&1 || { tail -20 "$STATE/mvn.log" >&2; exit 1; }
  fi
  mkdir "$ctx/libs" && cp "$broker_jars"/*.jar "$tools"/*.jar "$ctx/libs/"
  timed build "$KAFKA_IMG" "$ctx" --build-arg "BASE_IMAGE=$DEBIAN_IMG" --build-arg "KAFKA_VERSION=$KAFKA_VERSION"
  rm -rf "$ctx"
fi

# 5. Prometheus from Debian's package
has "$PROM_IMG" || timed build "$PROM_IMG" deploy/containers/prometheus --build-arg "BASE_IMAGE=$DEBIAN_IMG"

# 6. the daemon: the project's Dockerfile on the python stand-in
if ! has "$APP_IMG" || [ "$rebuild" = 1 ]; then
  timed build "$APP_IMG" . --build-arg "BASE_IMAGE=$PYTHON_IMG"
fi
log "images ready in $(( $(date +%s) - t0 ))s: $(podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'standin|source-backfill' | tr '\n' ';')"

# shellcheck shell=bash
# Shared settings of the scripts: where installed tools and the cargo target dir live.
# Both stay outside the clone, so a fresh clone on a machine that ran before reuses them.
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file
WAITROOM_CACHE=${WAITROOM_CACHE:-$HOME/.cache/waitroom}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$WAITROOM_CACHE/target}
STACK_DIR=${WAITROOM_STACK_DIR:-$WAITROOM_CACHE/stack}
TANSU_VERSION=0.6.0
# The broker's cargo features; the install dir is keyed by them, so a build with another feature
# set never passes for this one. postgres: the storage engine that survives a kill -9
# (docs/reliability-broker.md); dynostore,libsql: the others (sqlite:// for comparison).
TANSU_FEATURES=dynostore,libsql,postgres
TOOLS_DIR=$WAITROOM_CACHE/tools-tansu-pg
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
# wait_ready URL LOG: waits up to 60 s for the service at URL to answer /readyz, else dies with
# LOG's last lines. Ready, not only up (/healthz): on a fresh database the service applies its
# migrations and creates the bookings topic in the background after it starts listening, and a
# sale's shows and bookings need both.
wait_ready() {
  local end=$((SECONDS + 60))
  while ((SECONDS < end)); do
    curl -fsS --max-time 2 "$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "the service at $1 is not ready after 60 s: $(tail -3 "$2")"
}
# drop_keys PATTERN...: unlinks the keys matching each glob on the local cluster (every node is
# scanned; a replica refuses the UNLINK, its primary takes it), one command per key since a run's
# keys span many slots. The benchmark scripts call it on exit: their lines hold up to millions of
# people, and the cluster's maxmemory (1gb, noeviction) fills after a few runs otherwise.
drop_keys() {
  local p pat
  for p in 7000 7001 7002 7003 7004 7005; do
    for pat in "$@"; do
      redis-cli -p "$p" --scan --pattern "$pat" 2>/dev/null | sed 's/^/UNLINK /' \
        | redis-cli -p "$p" >/dev/null 2>&1 || true
    done
  done
}

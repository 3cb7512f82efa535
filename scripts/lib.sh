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

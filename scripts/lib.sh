# shellcheck shell=bash
# Shared settings of the scripts: where installed tools and the cargo target dir live.
# Both stay outside the clone, so a fresh clone on a machine that ran before reuses them.
WAITROOM_CACHE=${WAITROOM_CACHE:-$HOME/.cache/waitroom}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$WAITROOM_CACHE/target}
TOOLS_DIR=$WAITROOM_CACHE/tools
STACK_DIR=${WAITROOM_STACK_DIR:-$WAITROOM_CACHE/stack}
TANSU_VERSION=0.6.0
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

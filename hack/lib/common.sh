# shellcheck shell=bash disable=SC2034 # variables are used by the scripts that source this
# The shell helpers every script of hack/ shares (hack/cluster through its lib.sh,
# hack/demo through its lib.sh): the repo root, progress lines, failing, a script's
# --help, the Go build settings of the Makefile. Sourced, not executed.

GDD_REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

gdd_start_time=${gdd_start_time:-$(date +%s)}

# gdd_log prints a progress line with the time since the script started.
gdd_log() {
	local now
	now=$(date +%s)
	printf '[%s +%4ss] %s\n' "$(date +%H:%M:%S)" "$((now - gdd_start_time))" "$*" >&2
}

# gdd_die logs an error and exits 1.
gdd_die() {
	gdd_log "ERROR: $*"
	exit 1
}

# gdd_fmt_duration prints a number of seconds as 1m23s.
gdd_fmt_duration() {
	printf '%dm%02ds' "$(($1 / 60))" "$(($1 % 60))"
}

# gdd_usage prints the running script's usage: its header comment, from the
# second line down to `set -euo pipefail`. A script that changed directory
# before asking finds itself through GDD_CALLER_DIR, the directory it was
# started from.
gdd_usage() {
	local self=$0
	[[ -f $self ]] || self=${GDD_CALLER_DIR:-$PWD}/$0
	sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'
}

# gdd_go_env exports the cgo settings the Makefile builds with, so that the
# scripts share its build cache.
gdd_go_env() {
	export CGO_ENABLED=1 CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
}

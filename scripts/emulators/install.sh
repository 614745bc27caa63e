#!/usr/bin/env bash
# Installs the object store emulators that the s3, gcs and azure plugin tests
# start as subprocesses:
#   - versitygw (S3, Apache-2.0) with `go install`, into $(go env GOPATH)/bin
#   - Azurite (Azure Blob, MIT) with npm, into $STRATA_EMULATORS_DIR/azurite
#     (default: $HOME/.cache/strata/emulators/azurite); its azurite-blob
#     command is linked into $(go env GOPATH)/bin as well.
# The GCS tests use fsouza/fake-gcs-server in process (a Go module in
# go.mod), so nothing is installed for them.
#
# Idempotent: an emulator already at the pinned version is left alone. Quiet on
# success; on failure it prints the installer's output and exits non-zero.
#
# Override the pinned versions with VERSITYGW_VERSION / AZURITE_VERSION.
set -euo pipefail

VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.8.0}"
AZURITE_VERSION="${AZURITE_VERSION:-3.37.0}"

gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
mkdir -p "$gobin"
state="${STRATA_EMULATORS_DIR:-$HOME/.cache/strata/emulators}"
mkdir -p "$state"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
run() {
	if ! "$@" >"$log" 2>&1; then
		echo "install.sh: failed: $*" >&2
		cat "$log" >&2
		exit 1
	fi
}

# versitygw
stamp="$state/versitygw.version"
if [ ! -x "$gobin/versitygw" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$VERSITYGW_VERSION" ]; then
	run env GOBIN="$gobin" go install "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"
	echo "$VERSITYGW_VERSION" >"$stamp"
fi

# Azurite
prefix="$state/azurite"
stamp="$state/azurite.version"
if [ ! -x "$prefix/bin/azurite-blob" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$AZURITE_VERSION" ]; then
	command -v npm >/dev/null || { echo "install.sh: npm not found (apt-get install npm)" >&2; exit 1; }
	# Node trusts only its own CA list, not the system's: on a machine whose
	# registry traffic goes through a proxy with a local CA (in the system
	# bundle, as apt and go use it), npm fails with SELF_SIGNED_CERT_IN_CHAIN.
	# Add the system bundle unless the caller chose a file already.
	if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -r /etc/ssl/certs/ca-certificates.crt ]; then
		export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
	fi
	run npm install --global --prefix "$prefix" --no-audit --no-fund --loglevel=error "azurite@${AZURITE_VERSION}"
	echo "$AZURITE_VERSION" >"$stamp"
fi
ln -sf "$prefix/bin/azurite-blob" "$gobin/azurite-blob"

#!/usr/bin/env bash
# Runs one object store emulator in the foreground on 127.0.0.1, for trying
# strata by hand against s3, gcs or azure (the Go tests start their own, see
# README.md). It prints the settings to use, then runs until Ctrl-C; its data
# lives in a temporary folder that is removed on exit.
#
#   scripts/emulators/start.sh s3    [port]   # versitygw,  default port 7070
#   scripts/emulators/start.sh gcs   [port]   # fake-gcs-server, default 4443
#   scripts/emulators/start.sh azure [port]   # Azurite blob, default 10000
#
# Install the emulators first with scripts/emulators/install.sh.
set -euo pipefail

kind="${1:-}"
gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
export PATH="$gobin:$PATH"
dir="$(mktemp -d -t strata-emulator.XXXXXX)"
trap 'rm -rf "$dir"' EXIT

case "$kind" in
s3)
	port="${2:-7070}"
	command -v versitygw >/dev/null || { echo "versitygw not found: run scripts/emulators/install.sh" >&2; exit 1; }
	mkdir -p "$dir/posix"
	cat <<MSG
versitygw (S3) on http://127.0.0.1:$port, data in $dir
  export AWS_ACCESS_KEY_ID=strata AWS_SECRET_ACCESS_KEY=strata-secret-key AWS_REGION=us-east-1
  objectstore.s3: {bucket: strata, endpoint: "http://127.0.0.1:$port", path_style: true}
  (create the bucket first, e.g. with create_bucket: true in the s3 section)
MSG
	versitygw --access strata --secret strata-secret-key --region us-east-1 \
		--port "127.0.0.1:$port" posix "$dir/posix"
	;;
gcs)
	port="${2:-4443}"
	cat <<MSG
fake-gcs-server (GCS) on http://127.0.0.1:$port, in memory
  export STORAGE_EMULATOR_HOST=127.0.0.1:$port
  objectstore.gcs: {bucket: strata}
  (create the bucket first, e.g. create_bucket: true and project_id: test)
MSG
	go run github.com/fsouza/fake-gcs-server@v1.56.1 -scheme http -backend memory \
		-host 127.0.0.1 -port "$port" -public-host "127.0.0.1:$port" \
		-external-url "http://127.0.0.1:$port"
	;;
azure)
	port="${2:-10000}"
	command -v azurite-blob >/dev/null || { echo "azurite-blob not found: run scripts/emulators/install.sh" >&2; exit 1; }
	key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	cat <<MSG
Azurite (Azure Blob) on http://127.0.0.1:$port/devstoreaccount1, data in $dir
  export AZURE_STORAGE_CONNECTION_STRING='DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=$key;BlobEndpoint=http://127.0.0.1:$port/devstoreaccount1;'
  objectstore.azure: {container: strata}
  (create the container first, e.g. create_container: true in the azure section)
MSG
	azurite-blob --blobHost 127.0.0.1 --blobPort "$port" --location "$dir" \
		--skipApiVersionCheck --disableTelemetry --loose
	;;
*)
	sed -n '2,12p' "$0" >&2
	exit 2
	;;
esac

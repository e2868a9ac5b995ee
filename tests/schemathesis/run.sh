#!/usr/bin/env bash
# Schemathesis against a live `arbor serve`: no 5xx, and every response
# (status, Content-Type, headers, body, each SSE event) conforms to the
# server's own /openapi.json.
#
# Usage: tests/schemathesis/run.sh <baseUrl> <token> [more `schemathesis run` options]
#   e.g. tests/schemathesis/run.sh http://127.0.0.1:18090 secret
# Needs `schemathesis` on PATH (pip install -r tests/schemathesis/requirements.txt),
# or $SCHEMATHESIS naming the executable. Exits with schemathesis's status.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <baseUrl> <token> [schemathesis run options]" >&2
  exit 2
fi
base=${1%/}
token=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Hypothesis keeps a cache (.hypothesis/) in the working directory: keep it
# out of the checkout, and start from nothing each run.
HYPOTHESIS_STORAGE_DIRECTORY=$(mktemp -d)
export HYPOTHESIS_STORAGE_DIRECTORY
trap 'rm -rf "$HYPOTHESIS_STORAGE_DIRECTORY"' EXIT

# - The document comes from the live server, fetched with the token (it needs one).
# - Checks: the five that judge responses (no 5xx; status, Content-Type,
#   headers and body as documented), and three cheap ones that hold today:
#   ignored_auth (no or a wrong token gets 401), unsupported_method (405) and
#   allow_header_conformance (its Allow header). Not positive_data_acceptance:
#   the document cannot say which agents or models a config has, so valid-
#   looking bodies get 422 by design.
# - All phases (examples, coverage, fuzzing, stateful), 100 cases an operation,
#   a fixed seed, one worker: the same cases each run, well under 2 minutes.
# - filter_too_much: a false alarm of schemathesis on GET /v1/runs/{runId}
#   (its only parameter is a free string that run ids from earlier responses
#   fill in, so negative cases of it are mostly discarded); not an API fault.
# - --continue-on-failure: report every failure of a test, not just the first.
# - A request may take 30 s; an event stream is read for 20 events at most
#   (schemathesis's default) and 5 s (schemathesis.toml).
"${SCHEMATHESIS:-schemathesis}" --config-file "$here/schemathesis.toml" \
  run "$base/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,ignored_auth,unsupported_method,allow_header_conformance \
  --max-examples 100 \
  --seed 1 \
  --workers 1 \
  --suppress-health-check filter_too_much \
  --continue-on-failure \
  --request-timeout 30 \
  --no-color \
  "$@"

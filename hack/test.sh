#!/usr/bin/env bash
# make test: every package's tests against real API servers.
#
# test/e2e is most of the time and mostly waits (on Cluster API, the
# kubelet simulator, core's timers), so it runs as E2E_SHARDS processes
# (default 2), each with a world of its own, beside `go test` of every
# other package. Its tests are shared out by their measured durations
# (test/e2e/testdata/durations.tsv; a test not listed counts as
# E2E_DEFAULT_SECONDS), longest first onto the shard with the least so
# far: every Test function of the package runs in exactly one shard.
#
# Needs KUBEBUILDER_ASSETS and CAPA_BIN (the Makefile passes them).
# E2E_LIST=1 prints each shard's -test.run pattern and exits.
# E2E_FLAGS is passed to each shard's test binary (for example -test.v to
# see the durations to record).
set -euo pipefail
cd "$(dirname "$0")/.."

timeout=${TEST_TIMEOUT:-60m}
shards=${E2E_SHARDS:-2}
default_seconds=${E2E_DEFAULT_SECONDS:-60}
mkdir -p bin bin/test-logs

# The Test functions of test/e2e, by their declarations (listing them with
# the test binary would start the suite's world first).
mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*(t \*testing\.T)' test/e2e/*_test.go |
	sed 's/^func \(Test[A-Za-z0-9_]*\).*/\1/' | sort -u)
if [ "${#tests[@]}" -eq 0 ]; then
	echo "test.sh: no tests found in test/e2e" >&2
	exit 1
fi

# shard i's -test.run pattern, one per line.
mapfile -t patterns < <(printf '%s\n' "${tests[@]}" | awk -v n="$shards" -v def="$default_seconds" '
	FILENAME == ARGV[1] { if ($0 !~ /^#/ && NF >= 2) d[$1] = $2; next }
	{ t[++m] = $1; s[m] = ($1 in d) ? d[$1] : def }
	END {
		# longest first (stable by name), each onto the lightest shard
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
			if (s[j] > s[i] || (s[j] == s[i] && t[j] < t[i])) { x = s[i]; s[i] = s[j]; s[j] = x; y = t[i]; t[i] = t[j]; t[j] = y }
		for (k = 1; k <= n; k++) load[k] = 0
		for (i = 1; i <= m; i++) {
			b = 1
			for (k = 2; k <= n; k++) if (load[k] < load[b]) b = k
			load[b] += s[i]; list[b] = list[b] (list[b] == "" ? "" : "|") t[i]
		}
		for (k = 1; k <= n; k++) print "^(" list[k] ")$"
	}' test/e2e/testdata/durations.tsv -)

if [ -n "${E2E_LIST:-}" ]; then # print the shards' patterns only
	printf '%s\n' "${patterns[@]}"
	exit 0
fi

echo "test.sh: building test/e2e's test binary"
go test -c -o bin/e2e.test ./test/e2e

pids=()
names=()
run() { # name, command...
	local name=$1
	shift
	("$@" 2>&1 | tee "bin/test-logs/$name.log" | sed -u "s/^/[$name] /"; exit "${PIPESTATUS[0]}") &
	pids+=($!)
	names+=("$name")
}

mapfile -t others < <(go list ./... | grep -v '/test/e2e$')
run packages go test -count=1 -timeout "$timeout" "${others[@]}"
for i in "${!patterns[@]}"; do
	echo "test.sh: e2e-$((i + 1)) runs ${patterns[$i]}"
	# shellcheck disable=SC2086 # E2E_FLAGS is a list of flags
	run "e2e-$((i + 1))" bash -c 'cd test/e2e && exec ../../bin/e2e.test -test.count=1 -test.timeout "$1" -test.run "$2" '"${E2E_FLAGS:-}" _ "$timeout" "${patterns[$i]}"
done

failed=()
for i in "${!pids[@]}"; do
	if ! wait "${pids[$i]}"; then
		failed+=("${names[$i]}")
	fi
done
if [ "${#failed[@]}" -gt 0 ]; then
	# What failed, last, where a CI log that keeps only its tail shows it:
	# each failed stream's failing tests with the lines they logged.
	for name in "${failed[@]}"; do
		echo "test.sh: what failed in $name (bin/test-logs/$name.log has all of it):"
		grep -E -A 40 -e '^\s*--- FAIL' -e '^panic:' -e '^FAIL' -e 'test timed out' "bin/test-logs/$name.log" |
			grep -v -E '^\s*$' | head -n 300 | sed "s/^/[$name] /" || true
	done
	echo "test.sh: FAILED: ${failed[*]}"
	exit 1
fi
echo "test.sh: every package passed"

#!/usr/bin/env bash
# A burst to 1,000 single-pod nodes and back to 0 through each contender of
# the side-by-side bench (test/e2e BenchmarkSideBySide), with CPU profiles of
# each Karpenter process. Heavy: run it on a quiet machine (it prints the
# load average it started under).
#
#   BENCH_CONTENDERS  kwok,capi-md,machinedeployment,capi-machines,machine
#                     (default all five)
#   BENCH_DELAY       infrastructure delay = kwok's registration delay (default 5s)
#   BENCH_MDS         MachineDeployments of the same offering for the
#                     machinedeployment contender and its capi-md floor (default 1)
#   BENCH_1000_DIR    where results go (default bench-1000/ in the repository;
#                     a build artifact, do not commit)
#   BENCH_PLACEMENTS  shared,separated (default both, in this order): the
#                     world's two sides in processes of their own anywhere,
#                     then each on CPUs of its own (see hack/bench.sh)
#
# Writes results.json (the runs of every placement), table-<placement>.txt
# (the side-by-side table with the breakdown of each run) and, per placement
# and Karpenter contender, a merged CPU profile <placement>-<contender>.pprof
# with its top functions by cumulative time in <placement>-<contender>-top.txt. The Cluster API floors (capi-md, capi-machines) run no
# Karpenter process, so they have no profile: the world's CPU in the table is
# what they cost.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
	KUBEBUILDER_ASSETS="$("$root/hack/envtest-bins.sh")" || { echo "bench-1000: no envtest binaries" >&2; exit 1; }
	export KUBEBUILDER_ASSETS
fi
dir="${BENCH_1000_DIR:-$root/bench-1000}"
rm -rf "$dir" && mkdir -p "$dir/profiles"
echo "bench-1000: load average at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

status=0
placements="${BENCH_PLACEMENTS:-shared,separated}"
for placement in ${placements//,/ }; do
	echo "bench-1000: placement $placement, load average $(cut -d' ' -f1-3 /proc/loadavg)"
	mkdir -p "$dir/profiles/$placement"
	BENCH_N=1000 BENCH_PLACEMENT="$placement" BENCH_JSON="$dir/results.json" BENCH_PROFILE_DIR="$dir/profiles/$placement" \
		go test -run '^$' -bench '^BenchmarkSideBySide$' -benchtime 1x -timeout 4h ./test/e2e/ 2>&1 | tee "$dir/table-$placement.txt"
	[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1

	for c in kwok capi-md machinedeployment capi-machines machine; do
		profiles=("$dir"/profiles/"$placement"/sbs-"$c"-1000-*.pprof)
		# Not run (BENCH_CONTENDERS), or a floor: no process, no profile.
		[[ -e "${profiles[0]}" ]] || continue
		go tool pprof -proto "${profiles[@]}" > "$dir/$placement-$c.pprof" 2>/dev/null &&
			go tool pprof -top -cum -nodecount 60 "$dir/$placement-$c.pprof" > "$dir/$placement-$c-top.txt" 2>/dev/null
	done
done
echo "bench-1000: results in $dir (load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$status"

package pricing

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func q(s string) resource.Quantity { return resource.MustParse(s) }

func TestEstimate(t *testing.T) {
	tests := []struct {
		name        string
		cpu, memory resource.Quantity
		gpus        int64
		want        float64
	}{
		{"zero shape costs the floor", resource.Quantity{}, resource.Quantity{}, 0, BaseHourlyPrice},
		{"1 vCPU", q("1"), q("0"), 0, BaseHourlyPrice + 0.0336},
		{"1 GiB", q("0"), q("1Gi"), 0, BaseHourlyPrice + 0.0045},
		{"1 GPU", q("0"), q("0"), 1, BaseHourlyPrice + 0.90},
		{"m5.large-like", q("2"), q("8Gi"), 0, BaseHourlyPrice + 2*0.0336 + 8*0.0045},
		{"millicores count", q("500m"), q("512Mi"), 0, BaseHourlyPrice + 0.5*0.0336 + 0.5*0.0045},
		{"p3.2xlarge-like", q("8"), q("61Gi"), 1, BaseHourlyPrice + 8*0.0336 + 61*0.0045 + 0.90},
		{"negatives count as zero", q("-4"), q("-1Gi"), -3, BaseHourlyPrice},
		{"decimal memory", q("0"), q("1G"), 0, BaseHourlyPrice + 1e9/(1<<30)*0.0045},
		{"sub-unit amounts round up", q("1n"), q("1m"), 0, BaseHourlyPrice + 1e-9*CPUHourlyRate + MemoryHourlyRate/(1<<30)},
		{"extreme exponents", *resource.NewScaledQuantity(1, -2_000_000_000), *resource.NewScaledQuantity(1, 2_000_000_000), 0,
			BaseHourlyPrice + 1e-9*CPUHourlyRate + (MaxEstimateMemory>>30)*MemoryHourlyRate},
		{"1e2147483647", q("1e2147483647"), q("1e2147483647"), 0,
			BaseHourlyPrice + MaxEstimateCPU*CPUHourlyRate + (MaxEstimateMemory>>30)*MemoryHourlyRate},
		// Regression (from FuzzEstimate): amounts beyond float64 range.
		{"amounts beyond float64 are capped", q("1e400"), q("1e400"), 1,
			BaseHourlyPrice + MaxEstimateCPU*CPUHourlyRate + (MaxEstimateMemory>>30)*MemoryHourlyRate + GPUHourlyRate},
		{"huge amounts are capped", q("1e60"), q("1e60"), math.MaxInt64,
			BaseHourlyPrice + MaxEstimateCPU*CPUHourlyRate + (MaxEstimateMemory>>30)*MemoryHourlyRate + MaxEstimateGPUs*GPUHourlyRate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Estimate(tc.cpu, tc.memory, tc.gpus)
			if math.Abs(got-tc.want) > 1e-9*math.Max(1, tc.want) {
				t.Errorf("Estimate = %v, want %v", got, tc.want)
			}
			if !(got > 0) || math.IsInf(got, 0) {
				t.Errorf("Estimate = %v, want finite and > 0", got)
			}
		})
	}
}

func TestEstimateIgnoresRepresentation(t *testing.T) {
	for _, pair := range [][2]string{
		{"1", "1000m"}, {"1Gi", "1024Mi"}, {"1e3", "1k"}, {"0.5", "500m"},
		{"76105000000000000", "76.105P"}, {"1.000000000", "1"}, {"0.5Gi", "512Mi"},
	} {
		a := Estimate(q(pair[0]), q(pair[0]), 1)
		b := Estimate(q(pair[1]), q(pair[1]), 1)
		if a != b {
			t.Errorf("Estimate(%s) = %v, Estimate(%s) = %v", pair[0], a, pair[1], b)
		}
	}
}

// Shapes for the monotonicity tests, from tiny to the bounds.
var (
	cpuMillis   = []int64{0, 1, 250, 500, 1000, 2000, 3999, 64000, 448000, 1 << 20 * 1000, (MaxEstimateCPU - 1) * 1000}
	memoryMiB   = []int64{0, 1, 512, 1024, 3 * 1024, 16 * 1024, 768 * 1024, 24 << 20, (MaxEstimateMemory >> 20) - 1}
	gpuCounts   = []int64{0, 1, 2, 8, 16, 1000, MaxEstimateGPUs - 1}
	cpuSteps    = []int64{1, 10, 1000, 1000000}
	memorySteps = []int64{1, 1024, 1 << 20}
	gpuSteps    = []int64{1, 2, 1000}
)

func milliCPU(m int64) resource.Quantity { return *resource.NewMilliQuantity(m, resource.DecimalSI) }
func mib(n int64) resource.Quantity      { return *resource.NewQuantity(n<<20, resource.BinarySI) }

func TestEstimateStrictlyMonotonic(t *testing.T) {
	for _, c := range cpuMillis {
		for _, m := range memoryMiB {
			for _, g := range gpuCounts {
				base := Estimate(milliCPU(c), mib(m), g)
				if !(base > 0) || math.IsInf(base, 0) {
					t.Fatalf("Estimate(%dm, %dMi, %d) = %v", c, m, g, base)
				}
				for _, d := range cpuSteps {
					if c+d <= MaxEstimateCPU*1000 {
						if more := Estimate(milliCPU(c+d), mib(m), g); !(more > base) {
							t.Errorf("cpu %dm -> %dm (mem %dMi, gpus %d): %v -> %v", c, c+d, m, g, base, more)
						}
					}
				}
				for _, d := range memorySteps {
					if m+d <= MaxEstimateMemory>>20 {
						if more := Estimate(milliCPU(c), mib(m+d), g); !(more > base) {
							t.Errorf("memory %dMi -> %dMi (cpu %dm, gpus %d): %v -> %v", m, m+d, c, g, base, more)
						}
					}
				}
				for _, d := range gpuSteps {
					if g+d <= MaxEstimateGPUs {
						if more := Estimate(milliCPU(c), mib(m), g+d); !(more > base) {
							t.Errorf("gpus %d -> %d (cpu %dm, mem %dMi): %v -> %v", g, g+d, c, m, base, more)
						}
					}
				}
			}
		}
	}
}

// TestEstimateMonotonicSweep walks each resource one step at a time over a
// realistic range.
func TestEstimateMonotonicSweep(t *testing.T) {
	prev := 0.0
	for c := int64(0); c <= 256000; c++ {
		p := Estimate(milliCPU(c), mib(4096), 1)
		if !(p > prev) {
			t.Fatalf("cpu %dm: %v after %v", c, p, prev)
		}
		prev = p
	}
	prev = 0
	for m := int64(0); m <= 4<<20; m += 7 {
		p := Estimate(milliCPU(4000), mib(m), 1)
		if !(p > prev) {
			t.Fatalf("memory %dMi: %v after %v", m, p, prev)
		}
		prev = p
	}
	prev = 0
	for g := int64(0); g <= 4096; g++ {
		p := Estimate(milliCPU(4000), mib(4096), g)
		if !(p > prev) {
			t.Fatalf("gpus %d: %v after %v", g, p, prev)
		}
		prev = p
	}
}

// TestEstimateFuzzRegressions holds inputs FuzzEstimate found.
func TestEstimateFuzzRegressions(t *testing.T) {
	tests := []struct {
		cpu, memory, addCPU, addMemory string
		gpus                           int64
	}{
		// Adding 1 microbyte to 76.105P once lowered the price: the sum was
		// converted to float64 less precisely than 76.105P itself.
		{cpu: "38.34", memory: "76.105P", addCPU: "0", addMemory: "1.0u", gpus: 79},
	}
	for _, tc := range tests {
		cpu, memory := q(tc.cpu), q(tc.memory)
		p := Estimate(cpu, memory, tc.gpus)
		moreCPU, moreMemory := cpu.DeepCopy(), memory.DeepCopy()
		moreCPU.Add(q(tc.addCPU))
		moreMemory.Add(q(tc.addMemory))
		if more := Estimate(moreCPU, memory, tc.gpus); more < p {
			t.Errorf("cpu %s + %s: %v < %v", tc.cpu, tc.addCPU, more, p)
		}
		if more := Estimate(cpu, moreMemory, tc.gpus); more < p {
			t.Errorf("memory %s + %s: %v < %v", tc.memory, tc.addMemory, more, p)
		}
	}
}

func TestEstimateNonDecreasingBeyondBounds(t *testing.T) {
	at := Estimate(q("1073741824"), q("1Ei"), MaxEstimateGPUs)
	beyond := Estimate(q("1e19"), q("2Ei"), math.MaxInt64)
	if beyond < at || math.IsInf(beyond, 0) {
		t.Errorf("at bounds %v, beyond %v", at, beyond)
	}
}

func TestSpotEstimate(t *testing.T) {
	// Variables, so that the products below are rounded like SpotEstimate's
	// rather than computed exactly at compile time.
	frac, base, maxF := SpotFraction, BaseHourlyPrice, math.MaxFloat64
	tests := []struct {
		onDemand, want float64
	}{
		{1, frac},
		{0.096, 0.096 * frac},
		{base, base * frac},
		{0, base * frac},
		{-1, base * frac},
		{math.NaN(), base * frac},
		{math.Inf(-1), base * frac},
		{math.Inf(1), maxF * frac},
		{math.MaxFloat64, maxF * frac},
		{math.SmallestNonzeroFloat64, math.SmallestNonzeroFloat64},
	}
	for _, tc := range tests {
		got := SpotEstimate(tc.onDemand)
		if got != tc.want {
			t.Errorf("SpotEstimate(%v) = %v, want %v", tc.onDemand, got, tc.want)
		}
		if !(got > 0) || math.IsInf(got, 0) {
			t.Errorf("SpotEstimate(%v) = %v, want finite and > 0", tc.onDemand, got)
		}
	}
}

func TestSpotEstimateBelowOnDemand(t *testing.T) {
	for _, c := range cpuMillis {
		for _, m := range memoryMiB {
			for _, g := range gpuCounts {
				od := Estimate(milliCPU(c), mib(m), g)
				spot := SpotEstimate(od)
				if !(spot > 0 && spot < od) {
					t.Errorf("Estimate %v, SpotEstimate %v", od, spot)
				}
			}
		}
	}
}

package pricing

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func FuzzParsePrice(f *testing.F) {
	for _, s := range []string{
		"0.096", "1.5", " 2 ", ".5", "5.", "", "free", "-1", "0", "NaN", "Inf", "1e400",
		"0x1p-2", "1_000", "$1", "1000000", "1000000.1", "0." + strings.Repeat("0", 60) + "1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		price, err := ParsePrice(priceKey, value)
		if err != nil {
			if price != 0 || err.Key != priceKey || err.Value != value || err.Reason == "" {
				t.Fatalf("ParsePrice(%q) = %v, %#v", value, price, err)
			}
			prefix := "annotation " + strconv.Quote(priceKey) + ": " + quote(value) + " "
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Fatalf("Error() = %q, want prefix %q", err.Error(), prefix)
			}
			return
		}
		if !(price > 0) || math.IsInf(price, 0) || price > MaxPrice {
			t.Fatalf("ParsePrice(%q) = %v, want finite, > 0 and <= MaxPrice", value, price)
		}
		// It agrees with strconv on what it accepts.
		if ref, perr := strconv.ParseFloat(strings.TrimSpace(value), 64); perr != nil || ref != price {
			t.Fatalf("ParsePrice(%q) = %v, strconv gives %v, %v", value, price, ref, perr)
		}
		// Its own formatting of the price is accepted back.
		if again, err := ParsePrice(priceKey, strconv.FormatFloat(price, 'f', -1, 64)); err != nil || again != price {
			t.Fatalf("round trip of %v: %v, %v", price, again, err)
		}
	})
}

// quantitySuffixes are the suffixes fuzzQuantity picks from.
var quantitySuffixes = []string{
	"", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
	"e3", "e-3", "e18", "e-30", "e60", "e400",
}

// fuzzQuantity builds a quantity from fuzzer integers. It does not hand raw
// fuzzer strings to resource.ParseQuantity, which takes minutes on some short
// inputs such as "2e55555555555555" (found by this fuzz test).
func fuzzQuantity(t *testing.T, whole uint64, frac uint32, suffix uint8, negative bool) (resource.Quantity, string) {
	s := strconv.FormatUint(whole, 10) + "." + strconv.FormatUint(uint64(frac), 10) + quantitySuffixes[int(suffix)%len(quantitySuffixes)]
	if negative {
		s = "-" + s
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		t.Fatalf("resource.ParseQuantity(%q): %v", s, err)
	}
	return q, s
}

func FuzzEstimate(f *testing.F) {
	f.Add(uint64(2), uint32(0), uint8(0), false, uint64(8), uint32(0), uint8(12), false, int64(0), uint64(1), uint8(3), uint64(1), uint8(11), int64(1))
	f.Add(uint64(0), uint32(0), uint8(0), false, uint64(0), uint32(0), uint8(0), false, int64(0), uint64(1), uint8(3), uint64(1), uint8(11), int64(1))
	f.Add(uint64(4), uint32(5), uint8(0), true, uint64(1), uint32(0), uint8(12), true, int64(-1), uint64(100), uint8(0), uint64(100), uint8(12), int64(100))
	f.Add(uint64(1), uint32(0), uint8(20), false, uint64(1), uint32(0), uint8(21), false, int64(math.MaxInt64), uint64(1), uint8(0), uint64(1), uint8(0), int64(1))
	f.Fuzz(func(t *testing.T,
		cpuWhole uint64, cpuFrac uint32, cpuSuffix uint8, cpuNeg bool,
		memWhole uint64, memFrac uint32, memSuffix uint8, memNeg bool,
		gpus int64,
		dCPUWhole uint64, dCPUSuffix uint8, dMemWhole uint64, dMemSuffix uint8, dGPUs int64,
	) {
		cpu, cpuS := fuzzQuantity(t, cpuWhole, cpuFrac, cpuSuffix, cpuNeg)
		mem, memS := fuzzQuantity(t, memWhole, memFrac, memSuffix, memNeg)
		p := Estimate(cpu, mem, gpus)
		if !(p > 0) || math.IsInf(p, 0) {
			t.Fatalf("Estimate(%s, %s, %d) = %v", cpuS, memS, gpus, p)
		}
		if s := SpotEstimate(p); !(s > 0 && s < p) {
			t.Fatalf("SpotEstimate(%v) = %v", p, s)
		}
		// Adding any non-negative amount never lowers the price.
		dCPU, dCPUS := fuzzQuantity(t, dCPUWhole, 0, dCPUSuffix, false)
		dMem, dMemS := fuzzQuantity(t, dMemWhole, 0, dMemSuffix, false)
		moreCPU := cpu.DeepCopy()
		moreCPU.Add(dCPU)
		moreMem := mem.DeepCopy()
		moreMem.Add(dMem)
		moreGPUs := gpus
		if dGPUs > 0 && gpus <= math.MaxInt64-dGPUs {
			moreGPUs = gpus + dGPUs
		}
		if q := Estimate(moreCPU, mem, gpus); q < p {
			t.Fatalf("more cpu (%s + %s): %v < %v", cpuS, dCPUS, q, p)
		}
		if q := Estimate(cpu, moreMem, gpus); q < p {
			t.Fatalf("more memory (%s + %s): %v < %v", memS, dMemS, q, p)
		}
		if q := Estimate(cpu, mem, moreGPUs); q < p {
			t.Fatalf("more gpus (%d + %d): %v < %v", gpus, dGPUs, q, p)
		}
	})
}

func FuzzSpotEstimate(f *testing.F) {
	for _, v := range []float64{1, 0.096, 0, -1, math.NaN(), math.Inf(1), math.Inf(-1), math.MaxFloat64, math.SmallestNonzeroFloat64} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, onDemand float64) {
		s := SpotEstimate(onDemand)
		if !(s > 0) || math.IsInf(s, 0) {
			t.Fatalf("SpotEstimate(%v) = %v", onDemand, s)
		}
		if onDemand > 0 && !math.IsInf(onDemand, 0) && s > onDemand {
			t.Fatalf("SpotEstimate(%v) = %v, above on-demand", onDemand, s)
		}
	})
}

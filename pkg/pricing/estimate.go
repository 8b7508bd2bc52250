package pricing

import (
	"math"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Rates of the price estimate, roughly matching public on-demand cloud prices
// in US dollars per hour.
const (
	// CPUHourlyRate is the price of one vCPU for an hour.
	CPUHourlyRate = 0.0336
	// MemoryHourlyRate is the price of one GiB of memory for an hour.
	MemoryHourlyRate = 0.0045
	// GPUHourlyRate is the price of one GPU for an hour.
	GPUHourlyRate = 0.90
	// BaseHourlyPrice is added to every estimate so that it is positive even
	// for a zero shape.
	BaseHourlyPrice = 0.001
	// SpotFraction is the share of the on-demand price that SpotEstimate returns.
	SpotFraction = 0.35
)

// Bounds on the shape that Estimate prices; larger amounts are priced as the bound.
const (
	// MaxEstimateCPU is the largest number of vCPUs Estimate prices.
	MaxEstimateCPU = 1 << 30
	// MaxEstimateMemory is the largest memory size, in bytes, Estimate prices (1 EiB).
	MaxEstimateMemory = 1 << 60
	// MaxEstimateGPUs is the largest number of GPUs Estimate prices.
	MaxEstimateGPUs = 1 << 20
)

// Estimate returns a positive hourly price estimate for a machine shape when
// no price is given:
//
//	price = BaseHourlyPrice + CPUHourlyRate*vCPU + MemoryHourlyRate*GiB + GPUHourlyRate*GPUs
//	      = 0.001 + 0.0336*vCPU + 0.0045*GiB + 0.90*GPUs   (US$ per hour)
//
// where vCPU is cpu in cores, rounded up to a nanocore ("500m" is 0.5), and
// GiB is memory rounded up to a byte, in units of 2^30 bytes. BaseHourlyPrice
// is the floor: a zero shape costs 0.001. Negative amounts count as zero, and
// amounts above MaxEstimateCPU, MaxEstimateMemory and MaxEstimateGPUs count as
// those bounds, so the result is always finite and > 0.
//
// The estimate depends only on the values of cpu and memory, not on how they
// are written ("1" and "1000m" cost the same), and never decreases when any
// one resource grows. Within the bounds it is strictly monotonic: with the
// other resources equal, one more millicore of CPU, one more MiB of memory or
// one more GPU gives a strictly higher price. (Smaller steps may be lost to
// float64 rounding.)
//
// Estimate is cheap for any quantity, including ones such as 1e2147483647
// whose exact decimal expansion would not fit in memory.
func Estimate(cpu, memory resource.Quantity, gpus int64) float64 {
	nanoCores := ceilAmount(cpu, resource.Nano, MaxEstimateCPU*1e9)
	bytes := ceilAmount(memory, 0, MaxEstimateMemory)
	g := min(max(gpus, 0), MaxEstimateGPUs)
	cores := float64(nanoCores) / 1e9
	gib := float64(bytes) / (1 << 30)
	return BaseHourlyPrice + CPUHourlyRate*cores + MemoryHourlyRate*gib + GPUHourlyRate*float64(g)
}

// ceilAmount returns q in units of 10^unit, rounded up, clamped to
// [0, limit]. limit must be at most 4e18 so that twice it fits in an int64.
// The result is a non-decreasing function of the value of q.
//
// It first bounds the magnitude of q from the bit length of its unscaled value
// and its scale, so that it never does big-number arithmetic on quantities far
// outside [1, limit] units, which could take minutes.
func ceilAmount(q resource.Quantity, unit resource.Scale, limit int64) int64 {
	if q.Sign() <= 0 {
		return 0
	}
	d := q.AsDec() // value = unscaled * 10^-scale, with unscaled > 0
	bits := d.UnscaledBig().BitLen()
	exp := -float64(d.Scale()) - float64(unit)
	// log10(value in units) lies in [lower, upper).
	lower := float64(bits-1)*math.Log10(2) + exp
	upper := float64(bits)*math.Log10(2) + exp
	switch {
	case lower > math.Log10(float64(limit))+1e-6: // value > limit
		return limit
	case upper < -1e-6: // 0 < value < 1 unit, which rounds up to 1
		return 1
	}
	// (The margins cover the rounding error of lower and upper, which is below
	// 1e-7 even for bit lengths and scales near 2^31.)
	// Here value < 2.01*limit units, so the exact result fits in an int64.
	return min(q.ScaledValue(unit), limit)
}

// SpotEstimate returns the estimate for a spot offering: SpotFraction (0.35)
// of the on-demand price. The result is > 0 and finite for any input: it is at
// most onDemand for positive finite onDemand (equal only when rounding would
// otherwise give zero); an infinite onDemand counts as math.MaxFloat64, and a
// NaN, zero or negative one as BaseHourlyPrice.
func SpotEstimate(onDemand float64) float64 {
	switch {
	case math.IsNaN(onDemand) || onDemand <= 0:
		onDemand = BaseHourlyPrice
	case math.IsInf(onDemand, 1):
		onDemand = math.MaxFloat64
	}
	spot := onDemand * SpotFraction
	if spot <= 0 { // underflow of a subnormal onDemand
		return onDemand
	}
	return spot
}

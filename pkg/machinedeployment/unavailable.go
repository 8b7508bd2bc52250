package machinedeployment

import (
	"sync"

	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// unavailableView memoizes a Set with the exhausted offerings marked, per
// resolved Set and version of the unavailable-offerings cache.
type unavailableView struct {
	mu   sync.Mutex
	memo map[*instancetype.Set]viewEntry
}

type viewEntry struct {
	version int64
	set     *instancetype.Set
}

// WithUnavailable returns set with the offerings a failed launch left out
// marked unavailable (Available false), so that the cheapest choice and
// Karpenter's scheduling skip them for the TTL. set is not modified.
func (p *Provider) WithUnavailable(set *instancetype.Set) *instancetype.Set {
	if p.unavailable == nil || set == nil {
		return set
	}
	version := p.unavailable.Version()
	p.view.mu.Lock()
	defer p.view.mu.Unlock()
	if e, ok := p.view.memo[set]; ok && e.version == version {
		return e.set
	}
	out := set
	marked := false
	for key := range set.Origins {
		if p.unavailable.Has(key) {
			marked = true
			break
		}
	}
	if marked {
		out = &instancetype.Set{Origins: map[instancetype.OfferingKey][]instancetype.Source{}, Problems: set.Problems, Estimated: set.Estimated}
		for key, srcs := range set.Origins {
			if p.unavailable.Has(key) {
				copied := make([]instancetype.Source, len(srcs))
				for i, s := range srcs {
					s.Available = false
					copied[i] = s
				}
				srcs = copied
			}
			out.Origins[key] = srcs
		}
		for _, it := range set.InstanceTypes {
			out.InstanceTypes = append(out.InstanceTypes, p.markOfferings(it))
		}
	}
	if p.view.memo == nil || len(p.view.memo) > 64 {
		p.view.memo = map[*instancetype.Set]viewEntry{} // resolved sets change: drop the old
	}
	p.view.memo[set] = viewEntry{version: version, set: out}
	return out
}

// markOfferings returns it, or a copy with its exhausted offerings unavailable.
func (p *Provider) markOfferings(it *cloudprovider.InstanceType) *cloudprovider.InstanceType {
	var copied *cloudprovider.InstanceType
	for i, of := range it.Offerings {
		if !of.Available || !p.unavailable.Has(instancetype.KeyOf(it.Name, of)) {
			continue
		}
		if copied == nil {
			copied = &cloudprovider.InstanceType{
				Name: it.Name, Requirements: it.Requirements, Capacity: it.Capacity, Overhead: it.Overhead,
				VolumeAttachmentLimits: it.VolumeAttachmentLimits, DynamicResources: it.DynamicResources,
				Offerings: make(cloudprovider.Offerings, len(it.Offerings)),
			}
			copy(copied.Offerings, it.Offerings)
		}
		o := *of
		o.Available = false
		copied.Offerings[i] = &o
	}
	if copied == nil {
		return it
	}
	return copied
}

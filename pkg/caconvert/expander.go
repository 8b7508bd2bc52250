package caconvert

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Settings are cluster-autoscaler's own flags that the conversion follows.
type Settings struct {
	// Expanders is cluster-autoscaler's --expander, in order (default
	// "random").
	Expanders []string
	// Priorities is the priority expander's configuration: priority ->
	// patterns of node group ids (ParsePriorities).
	Priorities map[int][]*regexp.Regexp
	// AssumeNodeGroups names objects ("<name>" or "<namespace>/<name>")
	// whose min-size annotation was removed on purpose, to stop
	// cluster-autoscaler before --apply: they are converted with max-size
	// alone (--assume-node-group).
	AssumeNodeGroups []string
}

// assumed reports whether the object was named by --assume-node-group.
func (s Settings) assumed(namespace, name string) bool {
	for _, a := range s.AssumeNodeGroups {
		if a == name || a == namespace+"/"+name {
			return true
		}
	}
	return false
}

// ParseExpanders reads --expander's value ("priority,least-waste").
func ParseExpanders(s string) ([]string, error) {
	known := map[string]bool{"random": true, "most-pods": true, "least-waste": true, "price": true, "priority": true, "grpc": true, "least-nodes": true}
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if !known[e] {
			return nil, fmt.Errorf("--expander: %q is not an expander of cluster-autoscaler (random, most-pods, least-waste, least-nodes, price, priority, grpc)", e)
		}
		out = append(out, e)
	}
	return out, nil
}

// ParsePriorities reads the priority expander's configuration: either the
// ConfigMap cluster-autoscaler-priority-expander as YAML (its
// data.priorities is read) or the value of data.priorities itself, a map of
// priority to a list of regular expressions on node group ids.
func ParsePriorities(data []byte) (map[int][]*regexp.Regexp, error) {
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(data, &cm); err == nil && cm.Kind == "ConfigMap" {
		p, ok := cm.Data["priorities"]
		if !ok {
			return nil, fmt.Errorf("the ConfigMap has no data.priorities")
		}
		data = []byte(p)
	}
	var raw map[string][]string
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("priorities: not a map of priority to a list of patterns: %w", err)
	}
	out := map[int][]*regexp.Regexp{}
	for k, patterns := range raw {
		p, err := strconv.Atoi(strings.TrimSpace(k))
		if err != nil {
			return nil, fmt.Errorf("priorities: %q is not a whole number", k)
		}
		for _, pat := range patterns {
			re, err := regexp.Compile(pat)
			if err != nil {
				return nil, fmt.Errorf("priorities: priority %d: pattern %q: %w", p, pat, err)
			}
			out[p] = append(out[p], re)
		}
	}
	return out, nil
}

// priorityOf is the highest priority whose patterns match the node group
// (as the priority expander picks), and whether any matched.
func (s Settings) priorityOf(g *nodeGroup) (int, bool) {
	best, found := 0, false
	for p, res := range s.Priorities {
		for _, re := range res {
			if re.MatchString(g.id()) && (!found || p > best) {
				best, found = p, true
			}
		}
	}
	return best, found
}

func (s Settings) uses(expander string) bool {
	for _, e := range s.Expanders {
		if e == expander {
			return true
		}
	}
	return false
}

// weights maps the priorities in use to NodePool weights (1..100, higher
// wins in both): the priority itself when all fit, else their rank.
func weights(priorities []int) map[int]int32 {
	sort.Ints(priorities)
	out := map[int]int32{}
	fit := len(priorities) == 0 || (priorities[0] >= 1 && priorities[len(priorities)-1] <= 100)
	rank := int32(0)
	for i, p := range priorities {
		if i > 0 && priorities[i-1] == p {
			continue
		}
		rank++
		if fit {
			out[p] = int32(p)
		} else {
			out[p] = min(rank, 100)
		}
	}
	return out
}

// expanderFindings says what each expander in use becomes.
func expanderFindings(s Settings) []Finding {
	var out []Finding
	for _, e := range s.Expanders {
		f := Finding{Object: "--expander", Field: e, Kind: NotCarried}
		switch e {
		case "price":
			f.Kind = Mapped
			f.Message = "Karpenter always launches the cheapest offering that fits; prices come from " +
				"karpenter.cluster.x-k8s.io/price (and spot-price) annotations on the MachineDeployments or templates, else a resource-based estimate: add them"
		case "priority":
			f.Kind = Mapped
			f.Message = "node groups matched by the priority configuration go to NodePools with spec.weight (higher priority, higher weight); " +
				"Karpenter tries heavier NodePools first"
			if len(s.Priorities) == 0 {
				f.Kind = NotCarried
				f.Message = "no priority configuration given (--priority-config): no weights set"
			}
		case "least-waste", "most-pods", "least-nodes":
			f.Message = "Karpenter packs pods by price, not by " + e + "; node groups of one NodePool compete by price"
		case "random":
			f.Message = "Karpenter is deterministic: among node groups that fit it takes the cheapest"
		case "grpc":
			f.Message = "an external expander has no equivalent in Karpenter"
		}
		out = append(out, f)
	}
	return out
}

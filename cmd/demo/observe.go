package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// The workloads the demo scales (examples/demo/workload.yaml): one on the
// MachineDeployment-mode NodePool, one on the Machine-mode NodePool.
const workloadNamespace, workloadName, machinesWorkload = "default", "inflate", "inflate-machines"

// Modes, as the table shows them.
const (
	modeMachineDeployment = "MD"
	modeMachine           = "Machine"
)

// snapshot is what the clusters hold at one moment.
type snapshot struct {
	Replicas               int32 // the workload's desired replicas
	PodsPending, PodsBound int
	NodeClaims             map[string]nodeClaim
	Machines, MachinesUp   int // MachinesUp: phase Running
	Nodes                  map[string]node
	// Prices per offering (nodeclass/type/zone/capacity type), from the
	// provider's karpenter_clusterapi_offering_price metric.
	Prices map[string]float64
}

type nodeClaim struct {
	Mode             string
	Offering         offering
	Node, Machine    string
	Launched         bool
	Deleting         bool
	DisruptionReason string
}

type node struct {
	Mode     string
	Offering offering
	Ready    bool
	Pods     int
}

type offering struct{ NodeClass, Type, Zone, CapacityType string }

func (o offering) key() string {
	return strings.Join([]string{o.NodeClass, o.Type, o.Zone, o.CapacityType}, "/")
}

func (o offering) String() string { return o.Type + " in " + o.Zone + " (" + o.CapacityType + ")" }

// ReadyNodes counts the Nodes with condition Ready.
func (s *snapshot) ReadyNodes() int {
	n := 0
	for _, nd := range s.Nodes {
		if nd.Ready {
			n++
		}
	}
	return n
}

// Price is the hourly price of an offering. A Node whose NodeClaim is not
// known yet has no NodeClass: any NodeClass's price of the same type, zone
// and capacity type then does.
func (s *snapshot) Price(o offering) (float64, bool) {
	if p, ok := s.Prices[o.key()]; ok || o.NodeClass != "" {
		return p, ok
	}
	for k, p := range s.Prices {
		if _, rest, _ := strings.Cut(k, "/"); "/"+rest == o.key() {
			return p, true
		}
	}
	return 0, false
}

// Cost is the fleet's hourly cost: the price of every node's offering. ok is
// false when a node's price is not known (yet).
func (s *snapshot) Cost() (total float64, ok bool) {
	ok = true
	for _, nd := range s.Nodes {
		p, found := s.Price(nd.Offering)
		ok = ok && found
		total += p
	}
	return total, ok
}

// Settled: no pod waits, every NodeClaim has a Ready node, none is going.
func (s *snapshot) Settled() bool {
	if s.PodsPending > 0 || int(s.Replicas) != s.PodsBound {
		return false
	}
	for _, nc := range s.NodeClaims {
		if nc.Deleting || nc.Node == "" || !s.Nodes[nc.Node].Ready {
			return false
		}
	}
	return len(s.Nodes) == len(s.NodeClaims)
}

// observe reads both clusters and the provider's metrics.
func observe(ctx context.Context, w *world.World, p *provider) (*snapshot, error) {
	s := &snapshot{NodeClaims: map[string]nodeClaim{}, Nodes: map[string]node{}, Prices: map[string]float64{}}
	for _, name := range []string{workloadName, machinesWorkload} {
		d := &appsv1.Deployment{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Namespace: workloadNamespace, Name: name}, d); err != nil {
			return nil, err
		}
		if d.Spec.Replicas != nil {
			s.Replicas += *d.Spec.Replicas
		}
	}
	classes := &v1alpha1.ClusterAPINodeClassList{}
	if err := w.Spoke.Client.List(ctx, classes); err != nil {
		return nil, err
	}
	modes := map[string]string{}
	for _, c := range classes.Items {
		modes[c.Name] = modeMachineDeployment
		if c.Spec.MachineTemplate != nil {
			modes[c.Name] = modeMachine
		}
	}
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs); err != nil {
		return nil, err
	}
	nodeClass := map[string]string{} // node name or providerID -> NodeClass
	for _, nc := range ncs.Items {
		o := offering{Type: nc.Labels[corev1.LabelInstanceTypeStable], Zone: nc.Labels[corev1.LabelTopologyZone], CapacityType: nc.Labels[karpv1.CapacityTypeLabelKey]}
		if nc.Spec.NodeClassRef != nil {
			o.NodeClass = nc.Spec.NodeClassRef.Name
		}
		c := nodeClaim{Mode: modes[o.NodeClass], Offering: o, Node: nc.Status.NodeName,
			Launched: nc.Status.ProviderID != "", Deleting: !nc.DeletionTimestamp.IsZero()}
		if ns, name, ok := v1alpha1.MachineRef(nc.Annotations); ok {
			c.Machine = ns + "/" + name
		}
		if cond := nc.StatusConditions().Get(karpv1.ConditionTypeDisruptionReason); cond != nil && cond.IsTrue() {
			c.DisruptionReason = cond.Reason
		}
		s.NodeClaims[nc.Name] = c
		for _, k := range []string{c.Node, nc.Status.ProviderID} {
			if k != "" {
				nodeClass[k] = o.NodeClass
			}
		}
	}
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes); err != nil {
		return nil, err
	}
	for _, n := range nodes.Items {
		class, ok := nodeClass[n.Name]
		if !ok {
			class = nodeClass[n.Spec.ProviderID]
		}
		nd := node{Mode: modes[class], Offering: offering{NodeClass: class, Type: n.Labels[corev1.LabelInstanceTypeStable],
			Zone: n.Labels[corev1.LabelTopologyZone], CapacityType: n.Labels[karpv1.CapacityTypeLabelKey]}}
		for _, c := range n.Status.Conditions {
			nd.Ready = nd.Ready || (c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue)
		}
		s.Nodes[n.Name] = nd
	}
	pods := &corev1.PodList{}
	apps, _ := labels.Parse("app in (" + workloadName + "," + machinesWorkload + ")")
	if err := w.Spoke.Client.List(ctx, pods, client.InNamespace(workloadNamespace), client.MatchingLabelsSelector{Selector: apps}); err != nil {
		return nil, err
	}
	for _, pod := range pods.Items {
		switch {
		case !pod.DeletionTimestamp.IsZero():
		case pod.Spec.NodeName == "":
			s.PodsPending++
		default:
			s.PodsBound++
			if nd, ok := s.Nodes[pod.Spec.NodeName]; ok {
				nd.Pods++
				s.Nodes[pod.Spec.NodeName] = nd
			}
		}
	}
	machines := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: w.ClusterName}); err != nil {
		return nil, err
	}
	for _, m := range machines.Items {
		s.Machines++
		if m.Status.Phase == string(clusterv1.MachinePhaseRunning) {
			s.MachinesUp++
		}
	}
	if text, err := p.metrics(ctx); err == nil {
		s.Prices = parsePrices(text)
	}
	return s, nil
}

// parsePrices reads karpenter_clusterapi_offering_price samples.
func parsePrices(metrics string) map[string]float64 {
	const name = "karpenter_clusterapi_offering_price{"
	out := map[string]float64{}
	for _, line := range strings.Split(metrics, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		price, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			l[k] = strings.Trim(v, `"`)
		}
		out[offering{NodeClass: l["nodeclass"], Type: l["instance_type"], Zone: l["zone"], CapacityType: l["capacity_type"]}.key()] = price
	}
	return out
}

// eventLog keeps the last things that happened, newest last.
type eventLog struct {
	mu     sync.Mutex
	events []string
	t0     time.Time
}

func newEventLog(t0 time.Time) *eventLog { return &eventLog{t0: t0} }

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, fmt.Sprintf("%6s  %s", time.Since(l.t0).Round(time.Second), fmt.Sprintf(format, args...)))
}

// since returns the events after the first n, and the new count.
func (l *eventLog) since(n int) ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n > len(l.events) {
		n = len(l.events)
	}
	return append([]string(nil), l.events[n:]...), len(l.events)
}

// diff records what changed between two snapshots.
func diff(prev, cur *snapshot, events *eventLog) {
	price := func(o offering) string {
		if p, ok := cur.Price(o); ok {
			return fmt.Sprintf(" ($%.3f/h)", p)
		}
		return ""
	}
	for _, name := range sortedKeys(cur.NodeClaims) {
		nc, old := cur.NodeClaims[name], prev.NodeClaims[name]
		if _, existed := prev.NodeClaims[name]; !existed {
			if cur.PodsPending > 0 {
				events.add("NodeClaim %s created (%d pods pending)", name, cur.PodsPending)
			} else {
				events.add("NodeClaim %s created to replace a node", name)
			}
		}
		if nc.Launched && !old.Launched {
			events.add("[%s] NodeClaim %s launched: %s%s, Machine %s", nc.Mode, name, nc.Offering, price(nc.Offering), nc.Machine)
		}
		if nc.DisruptionReason != "" && old.DisruptionReason == "" {
			events.add("[%s] NodeClaim %s disrupted: %s", nc.Mode, name, nc.DisruptionReason)
		}
		if nc.Deleting && !old.Deleting {
			events.add("NodeClaim %s deleting (node %s)", name, orNone(nc.Node))
		}
	}
	for _, name := range sortedKeys(prev.NodeClaims) {
		if _, ok := cur.NodeClaims[name]; !ok {
			events.add("NodeClaim %s gone, its Machine %s released", name, orNone(prev.NodeClaims[name].Machine))
		}
	}
	for _, name := range sortedKeys(cur.Nodes) {
		if cur.Nodes[name].Ready && !prev.Nodes[name].Ready {
			events.add("[%s] Node %s Ready: %s", cur.Nodes[name].Mode, name, cur.Nodes[name].Offering)
		}
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

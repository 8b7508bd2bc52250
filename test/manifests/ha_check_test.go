package manifests

import (
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/leader"
)

// checkHighAvailability checks what keeps the provider available through a
// lost node, a zone outage, a drain and a rolling update: replicas never on
// one node and spread over zones, at most one disrupted at a time, lease
// timings the binary accepts, and in the workload cluster RBAC for the
// Lease the replicas elect on.
func checkHighAvailability(t *testing.T, objs []*unstructured.Unstructured, d *appsv1.Deployment, env map[string]string, topo topology) {
	t.Helper()
	pod := d.Spec.Template
	podLabels := labels.Set(pod.Labels)
	selects := func(sel *metav1.LabelSelector) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		return err == nil && !s.Empty() && s.Matches(podLabels)
	}

	apart := false
	if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			apart = apart || (term.TopologyKey == "kubernetes.io/hostname" && selects(term.LabelSelector))
		}
	}
	if !apart {
		t.Errorf("Deployment %s: replicas may share a node (want a required pod anti-affinity on kubernetes.io/hostname selecting its pods): one lost node would take both", d.Name)
	}
	spread := false
	for _, c := range pod.Spec.TopologySpreadConstraints {
		spread = spread || (c.TopologyKey == "topology.kubernetes.io/zone" && c.MaxSkew == 1 && selects(c.LabelSelector))
	}
	if !spread {
		t.Errorf("Deployment %s: no topology spread over topology.kubernetes.io/zone (maxSkew 1) selecting its pods", d.Name)
	}

	// A rolling update or a drain takes one replica at a time.
	for _, o := range find(objs, "PodDisruptionBudget") {
		pdb := &policyv1.PodDisruptionBudget{}
		convert(t, o, pdb)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("PodDisruptionBudget %s: want maxUnavailable 1, got %v (minAvailable %v)", pdb.Name, pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
		}
	}
	if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType && ru != nil &&
		ru.MaxUnavailable != nil && ru.MaxUnavailable.IntValue() > 1 {
		t.Errorf("Deployment %s: a rolling update may stop %s replicas at once", d.Name, ru.MaxUnavailable)
	}

	// Lease timings, as the binary validates them.
	s := leader.Settings{Enabled: true, LeaseDuration: leader.DefaultLeaseDuration, RenewDeadline: leader.DefaultRenewDeadline, RetryPeriod: leader.DefaultRetryPeriod}
	for k, p := range map[string]*time.Duration{
		"LEADER_ELECTION_LEASE_DURATION": &s.LeaseDuration,
		"LEADER_ELECTION_RENEW_DEADLINE": &s.RenewDeadline,
		"LEADER_ELECTION_RETRY_PERIOD":   &s.RetryPeriod,
	} {
		if v, ok := env[k]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Errorf("%s=%q: %v", k, v, err)
				continue
			}
			*p = d
		}
	}
	if err := s.Validate(); err != nil {
		t.Errorf("the binary would refuse the lease timings: %v", err)
	}

	if topo != inWorkloadCluster {
		return // the Lease lives in the workload cluster, reached with Cluster API's kubeconfig
	}
	name := env["LEADER_ELECTION_NAME"]
	if name == "" {
		name = "karpenter-leader-election" // core's default
	}
	if !grantsLeaseUpdate(t, objs, name) {
		t.Errorf("no Role lets the provider update its Lease %q (coordination.k8s.io leases: get, create, update)", name)
	}
}

func grantsLeaseUpdate(t *testing.T, objs []*unstructured.Unstructured, name string) bool {
	var get, create, update bool
	for _, o := range find(objs, "Role") {
		role := &rbacv1.Role{}
		convert(t, o, role)
		for _, r := range role.Rules {
			if !contains(r.APIGroups, "coordination.k8s.io") || !contains(r.Resources, "leases") {
				continue
			}
			named := len(r.ResourceNames) == 0 || contains(r.ResourceNames, name)
			get = get || (named && contains(r.Verbs, "get"))
			create = create || (len(r.ResourceNames) == 0 && contains(r.Verbs, "create"))
			update = update || (named && contains(r.Verbs, "update"))
		}
	}
	return get && create && update
}

package conformance

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// FleetLabel selects the conformance fleet: every MachineDeployment
// (MachineDeployment mode) or AWSMachineTemplate (Machine mode) the default
// NodeClass may use carries it.
const FleetLabel = "conformance.karpenter.cluster.x-k8s.io/fleet"

// Offering is one entry of the fleet: an instance type of the simulated EC2
// catalogue, a zone ("" = no failure domain, as most clusterctl templates
// leave worker MachineDeployments) and a capacity type.
type Offering struct {
	InstanceType string
	Zone         string
	Spot         bool
}

// Name is the MachineDeployment name of the offering.
func (o Offering) Name() string {
	zone := "nozone"
	if o.Zone != "" {
		zone = o.Zone[len(o.Zone)-1:]
	}
	market := "od"
	if o.Spot {
		market = "spot"
	}
	return fmt.Sprintf("fleet-%s-%s-%s", strings.ReplaceAll(o.InstanceType, ".", "-"), zone, market)
}

// onDemandPrice is the hourly us-east-1 on-demand price of each instance
// type; spot is spotDiscount of it. Real, distinct prices matter: Karpenter
// only ever replaces a node by a strictly cheaper one.
var onDemandPrice = map[string]float64{
	"t3.medium":   0.0416,
	"c5.large":    0.085,
	"c5.xlarge":   0.17,
	"m5.large":    0.096,
	"m5.xlarge":   0.192,
	"m5.2xlarge":  0.384,
	"r5.large":    0.126,
	"m6g.large":   0.077,
	"m6g.xlarge":  0.154,
	"g4dn.xlarge": 0.526,
}

const spotDiscount = 0.35

// Zones are the Cluster's failure domains. Four: Karpenter's
// DefaultTopologySpreadConstraints specs spread four pods over four zones
// ("no more than the number of zones the provider offers").
var Zones = []string{"us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"}

// Fleet is what a platform team would make eligible: several families
// (t, c, m, r, g) and sizes, amd64 and arm64, four zones, spot and
// on-demand, and some MachineDeployments without a failure domain.
func Fleet() []Offering {
	var out []Offering
	zones := Zones
	for _, it := range []string{"c5.large", "c5.xlarge", "m5.large", "m5.xlarge", "m5.2xlarge", "m6g.large", "m6g.xlarge"} {
		for _, z := range zones {
			out = append(out, Offering{InstanceType: it, Zone: z})
		}
	}
	for _, it := range []string{"t3.medium", "r5.large", "m5.xlarge", "g4dn.xlarge"} {
		out = append(out, Offering{InstanceType: it})
	}
	for _, it := range []string{"m5.large", "m6g.large", "c5.xlarge"} {
		for _, z := range zones[:2] {
			out = append(out, Offering{InstanceType: it, Zone: z, Spot: true})
		}
	}
	out = append(out, Offering{InstanceType: "m5.xlarge", Spot: true})
	return out
}

func priceAnnotations(instanceType string, spot bool) map[string]string {
	p := onDemandPrice[instanceType]
	if spot {
		return map[string]string{v1alpha1.SpotPriceAnnotation: fmt.Sprintf("%.4f", p*spotDiscount)}
	}
	return map[string]string{v1alpha1.PriceAnnotation: fmt.Sprintf("%.4f", p)}
}

// createMachineDeploymentFleet creates, for MachineDeployment mode, one
// AWSMachineTemplate per instance type and market, and one
// MachineDeployment per offering at replicas 0, each with its price. The
// templates carry the status CAPA writes (capacity, nodeInfo), so the
// MachineDeployments need no capacity annotations.
func createMachineDeploymentFleet(ctx context.Context, w *world.World, bootstrapSecret string) error {
	templates := map[string]bool{}
	for _, o := range Fleet() {
		tmplName := templateName(o.InstanceType, o.Spot)
		if !templates[tmplName] {
			templates[tmplName] = true
			if err := createTemplate(ctx, w, tmplName, o.InstanceType, o.Spot, nil); err != nil {
				return err
			}
		}
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
			Namespace: w.Namespace, Name: o.Name(), ClusterName: w.ClusterName,
			Labels:          map[string]string{FleetLabel: "true"},
			Member:          true,
			InfraTemplate:   tmplName,
			BootstrapSecret: bootstrapSecret,
			Annotations:     priceAnnotations(o.InstanceType, o.Spot),
			FailureDomain:   o.Zone,
		})
		if err := w.Hub.Client.Create(ctx, md); err != nil {
			return fmt.Errorf("creating MachineDeployment %s: %w", md.Name, err)
		}
	}
	return nil
}

// createMachineTemplateFleet creates, for Machine mode, the same fleet as
// eligible AWSMachineTemplates: one per instance type with its on-demand
// price, spot-capable (a spot price) where the MachineDeployment fleet has
// spot. Zones are the Cluster's failure domains, for every template (Machine
// mode has no per-template failure domain).
func createMachineTemplateFleet(ctx context.Context, w *world.World) error {
	spot := map[string]bool{}
	types := map[string]bool{}
	for _, o := range Fleet() {
		types[o.InstanceType] = true
		spot[o.InstanceType] = spot[o.InstanceType] || o.Spot
	}
	names := make([]string, 0, len(types))
	for it := range types {
		names = append(names, it)
	}
	sort.Strings(names)
	for _, it := range names {
		ann := priceAnnotations(it, false)
		if spot[it] {
			for k, v := range priceAnnotations(it, true) {
				ann[k] = v
			}
		}
		labels := map[string]string{FleetLabel: "true", v1alpha1.KarpenterMemberLabel: ""}
		if err := createTemplate(ctx, w, templateName(it, false), it, false, func(o client.Object) {
			o.SetAnnotations(ann)
			o.SetLabels(labels)
		}); err != nil {
			return err
		}
	}
	return nil
}

func templateName(instanceType string, spot bool) string {
	n := "fleet-" + strings.ReplaceAll(instanceType, ".", "-")
	if spot {
		n += "-spot"
	}
	return n
}

func createTemplate(ctx context.Context, w *world.World, name, instanceType string, spot bool, mutate func(client.Object)) error {
	t := world.AWSMachineTemplate(w.Namespace, name, instanceType, spot)
	if mutate != nil {
		mutate(t)
	}
	status := t.Status
	if err := w.Hub.Client.Create(ctx, t); err != nil {
		return fmt.Errorf("creating AWSMachineTemplate %s: %w", name, err)
	}
	t.Status = status
	if err := w.Hub.Client.Status().Update(ctx, t); err != nil {
		return fmt.Errorf("writing the status of AWSMachineTemplate %s: %w", name, err)
	}
	return nil
}

// CAPIUninitializedTaint is the taint Cluster API's kubeadm bootstrap
// provider registers every Node with; Cluster API removes it once it has
// copied the Machine's labels to the Node.
var CAPIUninitializedTaint = corev1.Taint{Key: "node.cluster.x-k8s.io/uninitialized", Effect: corev1.TaintEffectNoSchedule}

// bootstrapSecretName is the conformance fleet's bootstrap data Secret.
func bootstrapSecretName(w *world.World) string { return w.ClusterName + "-conformance-bootstrap" }

// KubeReserved is what the fleet's kubelets reserve for Kubernetes'
// daemons, about what the EKS AMI reserves on a 2-core node (a kubelet
// reserves nothing by default). The NodeClass declares the same
// (spec.kubelet.kubeReserved), so Karpenter computes the allocatable the
// nodes report.
var KubeReserved = map[string]string{"cpu": "100m", "memory": "512Mi"}

// createBootstrapSecret writes bootstrap data as CABPK renders it for a
// Karpenter node: register with Karpenter's unregistered taint and Cluster
// API's uninitialized taint, kube-reserved set.
func createBootstrapSecret(ctx context.Context, w *world.World) error {
	d := world.DefaultBootstrapData()
	d.Taints = append(d.Taints, CAPIUninitializedTaint)
	d.KubeletArgs = map[string]string{"kube-reserved": "cpu=" + KubeReserved["cpu"] + ",memory=" + KubeReserved["memory"]}
	s, err := world.BootstrapSecret(w.Namespace, bootstrapSecretName(w), w.ClusterName, d)
	if err != nil {
		return err
	}
	return w.Hub.Client.Create(ctx, s)
}

// bootstrapTemplateName is the Machine-mode fleet's KubeadmConfigTemplate.
func bootstrapTemplateName(w *world.World) string { return w.ClusterName + "-conformance-worker" }

// createBootstrapTemplate writes the KubeadmConfigTemplate Machine mode
// bootstraps from, as CAPA's cluster templates bootstrap workers: the same
// taints and kube-reserved as the bootstrap data Secret. The provider clones
// it into one KubeadmConfig per Machine with the NodeClaim's labels in the
// kubelet's node-labels, so the Node registers with them.
func createBootstrapTemplate(ctx context.Context, w *world.World) error {
	t := world.KubeadmConfigTemplate(w.Namespace, bootstrapTemplateName(w),
		map[string]string{"kube-reserved": "cpu=" + KubeReserved["cpu"] + ",memory=" + KubeReserved["memory"]})
	taints := append(*t.Spec.Template.Spec.JoinConfiguration.NodeRegistration.Taints, CAPIUninitializedTaint)
	t.Spec.Template.Spec.JoinConfiguration.NodeRegistration.Taints = &taints
	if err := w.Hub.Client.Create(ctx, t); err != nil {
		return fmt.Errorf("creating KubeadmConfigTemplate %s: %w", t.Name, err)
	}
	return nil
}

// nodeClassManifest is the suites' --default-nodeclass for a mode.
func nodeClassManifest(mode Mode, w *world.World) string {
	kubelet := fmt.Sprintf("  kubelet:\n    kubeReserved:\n      cpu: %s\n      memory: %s\n", KubeReserved["cpu"], KubeReserved["memory"])
	selector := fmt.Sprintf("    matchLabels:\n      %s: \"true\"\n", FleetLabel)
	if mode == ModeMachineDeployment {
		return "apiVersion: karpenter.cluster.x-k8s.io/v1alpha1\nkind: ClusterAPINodeClass\nmetadata:\n  name: default\nspec:\n" + kubelet + "  scalableResourceSelector:\n" + selector
	}
	return fmt.Sprintf(`apiVersion: karpenter.cluster.x-k8s.io/v1alpha1
kind: ClusterAPINodeClass
metadata:
  name: default
spec:
%s  machineTemplate:
    infrastructureTemplates:
      apiGroup: infrastructure.cluster.x-k8s.io
      kind: AWSMachineTemplate
      selector:
        matchLabels:
          %s: "true"
    bootstrap:
      configRef:
        apiGroup: bootstrap.cluster.x-k8s.io
        kind: KubeadmConfigTemplate
        name: %s
`, kubelet, FleetLabel, bootstrapTemplateName(w))
}

// nodePoolManifest is the suites' --default-nodepool: Karpenter's own
// default (test/pkg/environment/common/default_nodepool.yaml) plus Cluster
// API's registration taint as a startup taint, so Karpenter knows it goes
// away by itself and does not count a new node as full.
const nodePoolManifest = `apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
spec:
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: Never
    budgets:
      - nodes: 100%
  limits:
    cpu: 10000
    memory: 8000Gi
  template:
    spec:
      expireAfter: Never
      startupTaints:
        - key: node.cluster.x-k8s.io/uninitialized
          effect: NoSchedule
      requirements:
        - key: kubernetes.io/os
          operator: In
          values: ["linux"]
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["on-demand"]
      nodeClassRef:
        group: karpenter.cluster.x-k8s.io
        kind: ClusterAPINodeClass
        name: default
`

// defaultNodePool is nodePoolManifest for a group: narrowed to its NodeCPUs.
func defaultNodePool(g Group) string {
	if len(g.NodeCPUs) == 0 {
		return nodePoolManifest
	}
	values := make([]string, len(g.NodeCPUs))
	for i, n := range g.NodeCPUs {
		values[i] = strconv.Quote(strconv.Itoa(n))
	}
	narrowed := fmt.Sprintf("        - key: %s\n          operator: In\n          values: [%s]\n", v1alpha1.LabelInstanceCPU, strings.Join(values, ", "))
	const anchor = "      nodeClassRef:\n"
	return strings.Replace(nodePoolManifest, anchor, narrowed+anchor, 1)
}

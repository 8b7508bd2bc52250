package environment

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// MachineDeploymentOptions shape a test MachineDeployment.
type MachineDeploymentOptions struct {
	Namespace, Name, ClusterName string
	// Labels are added to the MachineDeployment's own labels.
	Labels map[string]string
	// Member adds the Karpenter member label.
	Member bool
	// InfraTemplate names the AWSMachineTemplate; Name when empty.
	InfraTemplate string
	// BootstrapSecret names the bootstrap data Secret; "<cluster>-bootstrap" when empty.
	BootstrapSecret string
	// BootstrapTemplate names a KubeadmConfigTemplate to bootstrap from
	// (spec.template.spec.bootstrap.configRef) instead of a Secret.
	BootstrapTemplate string
	Replicas          int32
	Annotations       map[string]string
	TemplateLabels    map[string]string
	FailureDomain     string
}

// NewMachineDeployment returns a MachineDeployment with the defaults Cluster
// API's defaulting webhook would set (cluster-name label, selector).
func NewMachineDeployment(o MachineDeploymentOptions) *clusterv1.MachineDeployment {
	labels := map[string]string{clusterv1.ClusterNameLabel: o.ClusterName}
	for k, v := range o.Labels {
		labels[k] = v
	}
	if o.Member {
		labels[v1alpha1.KarpenterMemberLabel] = ""
	}
	selector := map[string]string{
		clusterv1.ClusterNameLabel:           o.ClusterName,
		clusterv1.MachineDeploymentNameLabel: o.Name,
	}
	templateLabels := map[string]string{}
	for k, v := range selector {
		templateLabels[k] = v
	}
	for k, v := range o.TemplateLabels {
		templateLabels[k] = v
	}
	infra := o.InfraTemplate
	if infra == "" {
		infra = o.Name
	}
	secret := o.BootstrapSecret
	if secret == "" {
		secret = o.ClusterName + "-bootstrap"
	}
	bootstrap := clusterv1.Bootstrap{DataSecretName: &secret}
	if o.BootstrapTemplate != "" {
		bootstrap = clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfigTemplate", Name: o.BootstrapTemplate,
		}}
	}
	replicas := o.Replicas
	annotations := map[string]string{}
	for k, v := range o.Annotations {
		annotations[k] = v
	}
	return &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name, Labels: labels, Annotations: annotations},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: o.ClusterName,
			Replicas:    &replicas,
			Selector:    metav1.LabelSelector{MatchLabels: selector},
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: templateLabels},
				Spec: clusterv1.MachineSpec{
					ClusterName:   o.ClusterName,
					Bootstrap:     bootstrap,
					FailureDomain: o.FailureDomain,
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: "infrastructure.cluster.x-k8s.io",
						Kind:     "AWSMachineTemplate",
						Name:     infra,
					},
				},
			},
		},
	}
}

package v1alpha1

// KubeletConfiguration says how the kubelet of the NodeClass's nodes reserves
// resources and limits pods: the same fields, meaning and shape as
// Karpenter's AWS EC2NodeClass spec.kubelet. The provider does not
// configure the kubelet with it (the bootstrap does): it is what Karpenter
// plans with, for bootstraps the provider cannot read (anything but a
// KubeadmConfigTemplate's kubeletExtraArgs) or to correct what it reads.
// Each field set here wins over the bootstrap template's kubelet arguments,
// which win over the capacity.cluster-autoscaler.kubernetes.io/maxPods
// annotation, which wins over the kubelet's defaults (110 pods, nothing
// reserved, eviction-hard memory.available<100Mi,nodefs.available<10%).
// A value that cannot be used is reported on the NodeClass and the next
// source is used.
type KubeletConfiguration struct {
	// MaxPods is the kubelet's --max-pods: the most pods a node runs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxPods *int32 `json:"maxPods,omitempty"`

	// KubeReserved is the kubelet's --kube-reserved: resource quantities
	// reserved for Kubernetes system daemons.
	// +optional
	// +kubebuilder:validation:XValidation:message="valid keys for kubeReserved are ['cpu','memory','ephemeral-storage','pid']",rule="self.all(x, x=='cpu' || x=='memory' || x=='ephemeral-storage' || x=='pid')"
	// +kubebuilder:validation:XValidation:message="kubeReserved value cannot be a negative resource quantity",rule="self.all(x, !self[x].startsWith('-'))"
	KubeReserved map[string]string `json:"kubeReserved,omitempty"`

	// SystemReserved is the kubelet's --system-reserved: resource quantities
	// reserved for OS system daemons.
	// +optional
	// +kubebuilder:validation:XValidation:message="valid keys for systemReserved are ['cpu','memory','ephemeral-storage','pid']",rule="self.all(x, x=='cpu' || x=='memory' || x=='ephemeral-storage' || x=='pid')"
	// +kubebuilder:validation:XValidation:message="systemReserved value cannot be a negative resource quantity",rule="self.all(x, !self[x].startsWith('-'))"
	SystemReserved map[string]string `json:"systemReserved,omitempty"`

	// EvictionHard is the kubelet's --eviction-hard: signal -> threshold, a
	// quantity ("100Mi") or a percentage of capacity ("10%").
	// memory.available reduces allocatable memory and nodefs.available
	// allocatable ephemeral storage. Set, it replaces the kubelet's default
	// thresholds entirely, as the kubelet flag does.
	// +optional
	// +kubebuilder:validation:XValidation:message="valid keys for evictionHard are ['memory.available','nodefs.available','nodefs.inodesFree','imagefs.available','imagefs.inodesFree','pid.available']",rule="self.all(x, x in ['memory.available','nodefs.available','nodefs.inodesFree','imagefs.available','imagefs.inodesFree','pid.available'])"
	EvictionHard map[string]string `json:"evictionHard,omitempty"`
}

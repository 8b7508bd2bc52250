package v1alpha1

// Labels and annotations of the product contract (see docs/annotations.md).
const (
	// KarpenterMemberLabel marks a MachineDeployment or infrastructure template
	// as eligible for Karpenter, and a Machine as managed by Karpenter.
	KarpenterMemberLabel = "node.cluster.x-k8s.io/karpenter-member"
	// MachineAnnotation on a NodeClaim names the Machine backing it, and
	// MachineNamespaceAnnotation its namespace (MachineRef). They are Cluster
	// API's own keys with Cluster API's values: Karpenter core copies a
	// NodeClaim's annotations onto its Node, where Cluster API writes the
	// same two. NodeClaims launched by earlier versions carry <namespace>/<name> in
	// MachineAnnotation alone, which is still read.
	MachineAnnotation          = "cluster.x-k8s.io/machine"
	MachineNamespaceAnnotation = "cluster.x-k8s.io/cluster-namespace"
	// MachineDeploymentAnnotation on a NodeClaim names the MachineDeployment
	// <namespace>/<name> chosen for it, before its replica is raised.
	MachineDeploymentAnnotation = Group + "/machinedeployment"
	// NodeClaimAnnotation on a Machine names the NodeClaim it backs.
	NodeClaimAnnotation = Group + "/nodeclaim"
	// KubeletClientCSRAnnotation on a NodeClaim names the kubelet client
	// CertificateSigningRequest the provider approved for its node
	// (--approve-kubelet-csrs): one per NodeClaim.
	KubeletClientCSRAnnotation = Group + "/kubelet-client-csr"
	// PriceAnnotation is the on-demand price per hour (a decimal).
	PriceAnnotation = Group + "/price"
	// SpotPriceAnnotation is the spot price per hour (a decimal).
	SpotPriceAnnotation = Group + "/spot-price"
	// CurrentPriceAnnotation is read as the on-demand price, for compatibility
	// with the experimental Cluster API price operator.
	CurrentPriceAnnotation = "cluster.x-k8s.io/machine-current-price"

	// OfferingAnnotation on a NodeClaim, and on the Machine, infrastructure
	// machine and bootstrap config made for it (Machine mode), records the
	// offering chosen as <namespace>/<template>/<zone>/<capacity type>, so
	// that a retried Create resumes the same launch.
	OfferingAnnotation = Group + "/offering"
	// InstanceTypeAnnotation on a Machine (Machine mode) is the instance type
	// it was launched as.
	InstanceTypeAnnotation = Group + "/instance-type"
	// TemplateHashAnnotation on a Machine (Machine mode) is the hash of its
	// infrastructure template's spec.template when it was cloned.
	TemplateHashAnnotation = Group + "/template-hash"
	// BootstrapHashAnnotation on a Machine (Machine mode) is the hash of the
	// NodeClass's bootstrap settings (and bootstrap template) it was made with.
	BootstrapHashAnnotation = Group + "/bootstrap-hash"
	// ManagedLabel marks the infrastructure machines and bootstrap configs
	// the provider creates in Machine mode, so that leftovers of an
	// interrupted launch are found and removed.
	ManagedLabel = Group + "/managed"

	// ReservationCountAnnotation on an infrastructure template (or a
	// MachineDeployment) whose template launches into a capacity reservation
	// says how many instances the reservation holds: Cluster API does not know.
	ReservationCountAnnotation = Group + "/capacity-reservation-count"
	// ReservationZoneAnnotation says the zone of the reservation, needed when
	// the Cluster has several failure domains.
	ReservationZoneAnnotation = Group + "/capacity-reservation-zone"
	// ReservedPriceAnnotation is the price per hour of the reserved offering
	// (default: a millionth of the on-demand price, so Karpenter prefers it).
	ReservedPriceAnnotation = Group + "/reserved-price"
	// ReservationIDAnnotation on a Machine (Machine mode) names the capacity
	// reservation it was launched into: it holds one of its instances.
	ReservationIDAnnotation = Group + "/capacity-reservation-id"
)

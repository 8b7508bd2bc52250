package csrapproval

// What approving needs in the workload cluster, beside the provider's other
// rules: generated into config/rbac/csr-approver and the chart, and granted
// only when --approve-kubelet-csrs is on. Nodes, NodeClaims and events are
// in the provider's base rules already.
//
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=kubernetes.io/kube-apiserver-client-kubelet;kubernetes.io/kubelet-serving,verbs=approve

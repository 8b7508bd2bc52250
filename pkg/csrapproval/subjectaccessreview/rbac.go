// Package subjectaccessreview holds what the kubelet certificate approver
// needs in the workload cluster beside its own rules when
// --kubelet-csr-bootstrap-authorization=subjectaccessreview: asking whether
// a requester may create certificatesigningrequests/nodeclient. Generated
// into config/rbac/csr-approver-sar and the chart, and granted only then
// (config/components/kubelet-csr-subjectaccessreview, Helm value
// kubeletCSRBootstrapAuthorization).
package subjectaccessreview

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

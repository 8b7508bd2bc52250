package controllers

// What the provider adds, in the workload cluster, to Karpenter core's own
// rules (see config/rbac).
//
// +kubebuilder:rbac:groups=karpenter.cluster.x-k8s.io,resources=clusterapinodeclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=karpenter.cluster.x-k8s.io,resources=clusterapinodeclasses/status,verbs=get;update;patch

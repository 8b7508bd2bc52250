package autonode

// The AutoNode controller's rules in the management cluster (make generate
// writes config/rbac/autonode). It never holds the provider's rules itself:
// "bind" on their ClusterRole lets it grant them in a Cluster's namespace.
// Secrets: it reads Cluster API's kubeconfig Secrets and writes each
// provider's token Secret. In a workload cluster it acts with Cluster API's
// admin kubeconfig, so it needs no rules there.
//
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters/status,verbs=get;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;patch;update;delete
// +kubebuilder:rbac:groups="",resources=serviceaccounts;configmaps,verbs=get;create;patch;update;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=rolebindings,verbs=get;create;patch;update;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=karpenter-clusterapi-hub
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=karpenter-autonode,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=*,verbs=get

package v1alpha1

import "strings"

// MachineRef reads the Machine a NodeClaim's annotations name: the name in
// MachineAnnotation and the namespace in MachineNamespaceAnnotation, or
// both in MachineAnnotation as <namespace>/<name> (NodeClaims launched by
// earlier versions). ok is false when they name no Machine.
func MachineRef(annotations map[string]string) (namespace, name string, ok bool) {
	v := annotations[MachineAnnotation]
	if ns, n, found := strings.Cut(v, "/"); found {
		return ns, n, ns != "" && n != "" && !strings.Contains(n, "/")
	}
	ns := annotations[MachineNamespaceAnnotation]
	return ns, v, ns != "" && v != ""
}

// SetMachineRef records the Machine in annotations as MachineRef reads it,
// in Cluster API's own form (what it writes on the Node of that Machine).
func SetMachineRef(annotations map[string]string, namespace, name string) {
	annotations[MachineAnnotation] = name
	annotations[MachineNamespaceAnnotation] = namespace
}

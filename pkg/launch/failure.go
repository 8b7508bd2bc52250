// Package launch holds what both modes need to launch and to notice a failed
// launch: the infrastructure machine's failure reader and the cache of
// offerings left out after a capacity failure.
package launch

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// capacityCodes are the error codes with which clouds say an instance of
// that type, zone and capacity type cannot be had right now.
var capacityCodes = []string{
	"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
	"InsufficientReservedInstanceCapacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow",
	"UnfulfillableCapacity", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZonalAllocationFailed", "SkuNotAvailable",
	"AllocationFailed", "ReservationCapacityExceeded",
}

// LaunchFailure is what an infrastructure machine says about a failed launch.
type LaunchFailure struct {
	// Failed is true when the launch cannot succeed as it is: a terminal
	// failure, or an error that names missing capacity.
	Failed bool
	// InsufficientCapacity is true when the cloud lacks capacity for it.
	InsufficientCapacity bool
	Message              string
}

// ReadLaunchFailure reads an infrastructure machine the way Cluster API
// providers report failures: status.failureReason/failureMessage (terminal,
// the v1beta1 contract CAPA implements) and conditions that are False with
// a message naming a capacity error (CAPA reports a failed RunInstances as
// InstanceReady=False, reason InstanceProvisionFailed, and retries). A
// retried error that does not name capacity is not a failure: the provider
// may still succeed, and the launch timeout bounds the wait.
func ReadLaunchFailure(u *unstructured.Unstructured) LaunchFailure {
	reason, _, _ := unstructured.NestedString(u.Object, "status", "failureReason")
	message, _, _ := unstructured.NestedString(u.Object, "status", "failureMessage")
	if reason != "" || message != "" {
		text := strings.TrimSpace(reason + ": " + message)
		return LaunchFailure{Failed: true, InsufficientCapacity: namesCapacity(text), Message: text}
	}
	for _, path := range [][]string{{"status", "conditions"}, {"status", "v1beta2", "conditions"}} {
		raw, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
		conds, _ := raw.([]any)
		for _, c := range conds {
			cm, ok := c.(map[string]any)
			if !ok {
				continue
			}
			status, _ := cm["status"].(string)
			msg, _ := cm["message"].(string)
			if status == "False" && namesCapacity(msg) {
				return LaunchFailure{Failed: true, InsufficientCapacity: true, Message: msg}
			}
		}
	}
	return LaunchFailure{}
}

func namesCapacity(s string) bool {
	for _, code := range capacityCodes {
		if strings.Contains(s, code) {
			return true
		}
	}
	return false
}

package world

import (
	"fmt"

	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
)

// CapacityTypeReserved is the capacity type of an instance launched into a
// capacity reservation.
const CapacityTypeReserved = "reserved"

// capacityReservation is a simulated EC2 capacity reservation: a number of
// instances of one type in one zone.
type capacityReservation struct {
	instanceType, zone string
	count              int
}

// SetCapacityReservation creates (or resizes) a capacity reservation. An
// AWSMachine naming it (spec.capacityReservationId) launches into it while it
// has room; beyond its count RunInstances fails with
// ReservationCapacityExceeded, as EC2 fails a targeted reservation that is full.
func (a *SimAWS) SetCapacityReservation(id, instanceType, zone string, count int) {
	a.mu.Lock()
	if a.reservations == nil {
		a.reservations = map[string]capacityReservation{}
	}
	a.reservations[id] = capacityReservation{instanceType: instanceType, zone: zone, count: count}
	a.mu.Unlock()
	a.requeueAll()
}

// checkReservation is RunInstances' check of a targeted reservation; the
// caller holds a.mu.
func (a *SimAWS) checkReservation(am *infrav1.AWSMachine, zone string) (string, error) {
	if am.Spec.CapacityReservationID == nil || *am.Spec.CapacityReservationID == "" {
		return "", nil
	}
	id := *am.Spec.CapacityReservationID
	r, ok := a.reservations[id]
	if !ok {
		return "", &launchError{code: "InvalidCapacityReservationId.NotFound", message: fmt.Sprintf("The capacity reservation ID '%s' does not exist", id)}
	}
	if r.instanceType != am.Spec.InstanceType || r.zone != zone {
		return "", &launchError{code: "InvalidParameterCombination", message: fmt.Sprintf(
			"capacity reservation %s is for %s in %s, the request is for %s in %s", id, r.instanceType, r.zone, am.Spec.InstanceType, zone)}
	}
	used := 0
	for _, in := range a.byID {
		if in.ReservationID == id && in.State != infrav1.InstanceStateTerminated {
			used++
		}
	}
	if used >= r.count {
		return "", &launchError{code: "ReservationCapacityExceeded", message: fmt.Sprintf(
			"The requested capacity reservation %s does not have sufficient compatible and available capacity (%d of %d in use)", id, used, r.count)}
	}
	return id, nil
}

package options

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FlagRepairConditions names the node conditions, besides Ready, that make
// Karpenter replace a node (feature gate NodeRepair).
const FlagRepairConditions = "repair-conditions"

// RepairCondition is a node condition that makes a node unhealthy once it
// held for Toleration: what a MachineHealthCheck's unhealthyNodeConditions
// say, for Karpenter's node repair.
type RepairCondition struct {
	Type       corev1.NodeConditionType
	Status     corev1.ConditionStatus
	Toleration time.Duration
}

// ParseRepairConditions parses "<type>=<status>:<toleration>,..." (for
// example "KernelDeadlock=True:10m,ReadonlyFilesystem=True:10m", conditions
// node-problem-detector sets). Ready is repaired by default and cannot be
// listed; a condition may appear once per status.
func ParseRepairConditions(s string) ([]RepairCondition, error) {
	var out []RepairCondition
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		cond, tol, ok := strings.Cut(item, ":")
		t, st, ok2 := strings.Cut(cond, "=")
		if !ok || !ok2 {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): %q is not <type>=<status>:<toleration>", FlagRepairConditions, item)
		}
		t, st = strings.TrimSpace(t), strings.TrimSpace(st)
		if errs := validation.IsQualifiedName(t); len(errs) > 0 {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): condition type %q: %s", FlagRepairConditions, t, strings.Join(errs, "; "))
		}
		if t == string(corev1.NodeReady) {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): Ready is repaired already (False or Unknown for 30m); list other conditions", FlagRepairConditions)
		}
		status := corev1.ConditionStatus(st)
		if status != corev1.ConditionTrue && status != corev1.ConditionFalse && status != corev1.ConditionUnknown {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): %q: status %q is not True, False or Unknown", FlagRepairConditions, item, st)
		}
		d, err := time.ParseDuration(strings.TrimSpace(tol))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): %q: toleration %q is not a positive duration", FlagRepairConditions, item, tol)
		}
		if key := t + "=" + st; seen[key] {
			return nil, fmt.Errorf("--%s (REPAIR_CONDITIONS): %s is listed twice", FlagRepairConditions, key)
		} else {
			seen[key] = true
		}
		out = append(out, RepairCondition{Type: corev1.NodeConditionType(t), Status: status, Toleration: d})
	}
	return out, nil
}

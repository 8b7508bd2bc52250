package options

import "testing"

// The approver is off unless asked for, by flag or environment.
func TestApproveKubeletCSRs(t *testing.T) {
	if ours, _ := parse(t); ours.ApproveKubeletCSRs {
		t.Error("the kubelet certificate approver is on by default")
	}
	if ours, _ := parse(t, "--"+FlagApproveKubeletCSRs); !ours.ApproveKubeletCSRs {
		t.Errorf("--%s left the approver off", FlagApproveKubeletCSRs)
	}
	t.Setenv("APPROVE_KUBELET_CSRS", "true")
	if ours, _ := parse(t); !ours.ApproveKubeletCSRs {
		t.Error("APPROVE_KUBELET_CSRS=true left the approver off")
	}
	if ours, _ := parse(t, "--"+FlagApproveKubeletCSRs+"=false"); ours.ApproveKubeletCSRs {
		t.Error("the flag set to false does not win over the environment")
	}
}

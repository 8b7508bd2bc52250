package world_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// testDaemonSet: kube-controller-manager's daemonset controller puts a Pod on
// every simulated Node, and the simulated kubelets run them.
func testDaemonSet(ctx context.Context, t *testing.T, w *world.World, nodes int) {
	spoke := w.Spoke.Client
	labels := map[string]string{"app": "ds"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ds"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers:  []corev1.Container{{Name: "ds", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
	if err := spoke.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "a running DaemonSet pod per Node", func(ctx context.Context) (bool, string, error) {
		if err := spoke.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil {
			return false, "", err
		}
		return int(ds.Status.NumberReady) == nodes, fmt.Sprintf("desired %d, ready %d", ds.Status.DesiredNumberScheduled, ds.Status.NumberReady), nil
	})
	if err := spoke.Delete(ctx, ds); err != nil {
		t.Error(err)
	}
}

// testPodTermination: a deleted Pod stays Running and Ready while its preStop
// hook runs, and is gone once it ended; a hook longer than the grace period
// is cut short by it.
func testPodTermination(ctx context.Context, t *testing.T, w *world.World, node string) {
	spoke := w.Spoke.Client
	pod := func(name string, hook, grace int64) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				NodeName:                      node,
				TerminationGracePeriodSeconds: ptr.To(grace),
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{
					Name: "app", Image: "alpine:3.20.2", Command: []string{"/bin/sh", "-c", "sleep 1000"},
					Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
						Command: []string{"/bin/sh", "-c", fmt.Sprintf("sleep %d", hook)},
					}}},
				}},
			},
		}
	}
	hooked, cut := pod("prestop-4s", 4, 30), pod("prestop-cut", 300, 3)
	for _, p := range []*corev1.Pod{hooked, cut} {
		if err := spoke.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []*corev1.Pod{hooked, cut} {
		waitFor(ctx, t, 30*time.Second, "pod "+p.Name+" running", func(ctx context.Context) (bool, string, error) {
			err := spoke.Get(ctx, client.ObjectKeyFromObject(p), p)
			return err == nil && p.Status.Phase == corev1.PodRunning, string(p.Status.Phase), err
		})
	}
	deleted := time.Now()
	for _, p := range []*corev1.Pod{hooked, cut} {
		if err := spoke.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	gone := map[string]time.Duration{}
	waitFor(ctx, t, 30*time.Second, "both pods gone", func(ctx context.Context) (bool, string, error) {
		for _, p := range []*corev1.Pod{hooked, cut} {
			if _, ok := gone[p.Name]; ok {
				continue
			}
			cur := &corev1.Pod{}
			err := spoke.Get(ctx, client.ObjectKeyFromObject(p), cur)
			if apierrors.IsNotFound(err) {
				gone[p.Name] = time.Since(deleted)
				continue
			}
			if err != nil {
				return false, "", err
			}
			if !podReady(cur) {
				return false, "", fmt.Errorf("pod %s not Ready while terminating: %v", p.Name, cur.Status.Conditions)
			}
		}
		return len(gone) == 2, fmt.Sprintf("gone: %v", gone), nil
	})
	if d := gone[hooked.Name]; d < 3500*time.Millisecond || d > 10*time.Second {
		t.Errorf("pod with a 4s preStop hook gone %s after deletion, want about 4s", d)
	}
	if d := gone[cut.Name]; d < 2500*time.Millisecond || d > 8*time.Second {
		t.Errorf("pod with a 300s preStop hook and a 3s grace period gone %s after deletion, want about 3s", d)
	}
	t.Logf("terminating pods gone after %s (4s hook) and %s (3s grace)", gone[hooked.Name].Round(100*time.Millisecond), gone[cut.Name].Round(100*time.Millisecond))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// testReadinessProbe: a simulated container serves nothing, so a pod whose
// container has a readiness probe runs but never becomes Ready (as the pause
// image behind an HTTP probe on a real kubelet: Karpenter's drift spec on
// unhealthy PodDisruptionBudgets relies on it); one without a probe does.
func testReadinessProbe(ctx context.Context, t *testing.T, w *world.World, node string) {
	spoke := w.Spoke.Client
	pod := func(name string, probe *corev1.Probe) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				NodeName:    node,
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers:  []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10", ReadinessProbe: probe}},
			},
		}
	}
	probed := pod("probed", &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80)}}})
	plain := pod("unprobed", nil)
	for _, p := range []*corev1.Pod{probed, plain} {
		if err := spoke.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, 30*time.Second, "both pods running, the unprobed one Ready", func(ctx context.Context) (bool, string, error) {
		for _, p := range []*corev1.Pod{probed, plain} {
			if err := spoke.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return false, "", err
			}
		}
		return probed.Status.Phase == corev1.PodRunning && podReady(plain), fmt.Sprintf("probed %s, unprobed %s ready=%v", probed.Status.Phase, plain.Status.Phase, podReady(plain)), nil
	})
	if podReady(probed) || len(probed.Status.ContainerStatuses) != 1 || probed.Status.ContainerStatuses[0].Ready {
		t.Errorf("a pod whose readiness probe nothing answers is Ready: %+v", probed.Status)
	}
	for _, p := range []*corev1.Pod{probed, plain} {
		if err := spoke.Delete(ctx, p, client.GracePeriodSeconds(0)); err != nil {
			t.Error(err)
		}
	}
}

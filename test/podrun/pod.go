package podrun

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pod is one Pod being started: its directory, which stands for its root
// file system, and the rewrites of paths and addresses.
type pod struct {
	name, namespace, root string
	rewrites              []string // old, new pairs for strings.NewReplacer
}

func (r *Runner) startPod(ctx context.Context, d *appsv1.Deployment, name string) (*Process, error) {
	spec := d.Spec.Template.Spec
	if len(spec.Containers) != 1 || len(spec.InitContainers) > 0 {
		return nil, fmt.Errorf("runs Pods of one container only, not %d (and %d init containers)", len(spec.Containers), len(spec.InitContainers))
	}
	ctr := spec.Containers[0]
	p := &pod{name: name, namespace: d.Namespace, root: filepath.Join(r.o.Dir, "pods", d.Namespace, name)}
	if err := p.plan(r, spec, ctr); err != nil {
		return nil, err
	}
	if err := r.mountServiceAccount(ctx, p, spec); err != nil {
		return nil, err
	}
	for _, m := range ctr.VolumeMounts {
		if err := r.mountVolume(ctx, p, spec, m); err != nil {
			return nil, err
		}
	}
	env, err := r.environment(ctx, p, spec, ctr)
	if err != nil {
		return nil, err
	}
	return r.exec(p, ctr, env)
}

// plan decides the rewrites: every mount path (and the token's) into the
// Pod's directory, the in-cluster API server address to the real one.
func (p *pod) plan(r *Runner, spec corev1.PodSpec, ctr corev1.Container) error {
	paths := []string{}
	for _, m := range ctr.VolumeMounts {
		paths = append(paths, m.MountPath)
	}
	if ptr.Deref(spec.AutomountServiceAccountToken, true) {
		paths = append(paths, serviceAccountDir)
	}
	// Longest first: a mount inside another is rewritten as itself.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	for _, path := range paths {
		p.rewrites = append(p.rewrites, path, filepath.Join(p.root, path))
	}
	p.rewrites = append(p.rewrites, InClusterServer, r.o.Config.Host)
	return os.MkdirAll(p.root, 0o755)
}

func (p *pod) rewrite(s string) string { return strings.NewReplacer(p.rewrites...).Replace(s) }

// write writes a file of a volume at its mount path in the Pod's directory.
func (p *pod) write(mountPath, file string, data []byte) error {
	path := filepath.Join(p.root, mountPath, file)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(p.rewrite(string(data))), 0o600)
}

// mountServiceAccount writes the token, CA and namespace the kubelet
// projects: a token the TokenRequest API issues for the Pod's
// ServiceAccount, so the Pod's rights are that ServiceAccount's.
func (r *Runner) mountServiceAccount(ctx context.Context, p *pod, spec corev1.PodSpec) error {
	if !ptr.Deref(spec.AutomountServiceAccountToken, true) {
		return nil
	}
	sa := spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := r.kube.CoreV1().ServiceAccounts(p.namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", p.namespace, sa, err)
	}
	ca := r.o.Config.CAData
	if len(ca) == 0 && r.o.Config.CAFile != "" {
		if ca, err = os.ReadFile(r.o.Config.CAFile); err != nil {
			return err
		}
	}
	for file, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": ca, "namespace": []byte(p.namespace)} {
		if err := p.write(serviceAccountDir, file, data); err != nil {
			return err
		}
	}
	return nil
}

// mountVolume writes a ConfigMap or Secret volume's keys (or items).
func (r *Runner) mountVolume(ctx context.Context, p *pod, spec corev1.PodSpec, m corev1.VolumeMount) error {
	var v *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == m.Name {
			v = &spec.Volumes[i]
		}
	}
	if v == nil {
		return fmt.Errorf("volume mount %s names no volume", m.Name)
	}
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case v.ConfigMap != nil:
		cm := &corev1.ConfigMap{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: v.ConfigMap.Name}, cm); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		data = map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		items = v.ConfigMap.Items
	case v.Secret != nil:
		s := &corev1.Secret{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: v.Secret.SecretName}, s); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		data, items = s.Data, v.Secret.Items
	default:
		return fmt.Errorf("volume %s: only ConfigMap and Secret volumes", v.Name)
	}
	if len(items) == 0 {
		for _, k := range sortedKeys(data) {
			items = append(items, corev1.KeyToPath{Key: k, Path: k})
		}
	}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			return fmt.Errorf("volume %s: no key %s", v.Name, it.Key)
		}
		if err := p.write(m.MountPath, it.Path, b); err != nil {
			return err
		}
	}
	return nil
}

// environment is the container's environment as the kubelet builds it:
// the API server's service variables, envFrom, then env in order.
func (r *Runner) environment(ctx context.Context, p *pod, spec corev1.PodSpec, ctr corev1.Container) ([]string, error) {
	host, port, err := apiServer(r.o.Config)
	if err != nil {
		return nil, err
	}
	env := []string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port, "HOME=" + p.root}
	for _, from := range ctr.EnvFrom {
		vars, err := r.envFrom(ctx, p.namespace, from)
		if err != nil {
			return nil, err
		}
		env = append(env, vars...)
	}
	for _, e := range ctr.Env {
		v, err := r.envValue(ctx, p, spec, ctr, e)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		env = append(env, e.Name+"="+p.rewrite(v))
	}
	return env, nil
}

func (r *Runner) envFrom(ctx context.Context, namespace string, from corev1.EnvFromSource) ([]string, error) {
	var out []string
	switch {
	case from.ConfigMapRef != nil:
		cm := &corev1.ConfigMap{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: from.ConfigMapRef.Name}, cm); err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(cm.Data) {
			out = append(out, from.Prefix+k+"="+cm.Data[k])
		}
	case from.SecretRef != nil:
		s := &corev1.Secret{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: from.SecretRef.Name}, s); err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(s.Data) {
			out = append(out, from.Prefix+k+"="+string(s.Data[k]))
		}
	}
	return out, nil
}

func (r *Runner) envValue(ctx context.Context, p *pod, spec corev1.PodSpec, ctr corev1.Container, e corev1.EnvVar) (string, error) {
	src := e.ValueFrom
	switch {
	case src == nil:
		return e.Value, nil
	case src.FieldRef != nil:
		switch src.FieldRef.FieldPath {
		case "metadata.namespace":
			return p.namespace, nil
		case "metadata.name":
			return p.name, nil
		case "spec.serviceAccountName":
			return spec.ServiceAccountName, nil
		}
		return "", fmt.Errorf("field %s is not emulated", src.FieldRef.FieldPath)
	case src.ResourceFieldRef != nil:
		return resourceValue(ctr, src.ResourceFieldRef)
	case src.ConfigMapKeyRef != nil:
		cm := &corev1.ConfigMap{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: src.ConfigMapKeyRef.Name}, cm); err != nil {
			return "", err
		}
		return cm.Data[src.ConfigMapKeyRef.Key], nil
	case src.SecretKeyRef != nil:
		s := &corev1.Secret{}
		if err := r.client.Get(ctx, client.ObjectKey{Namespace: p.namespace, Name: src.SecretKeyRef.Name}, s); err != nil {
			return "", err
		}
		return string(s.Data[src.SecretKeyRef.Key]), nil
	}
	return "", errors.New("unsupported valueFrom")
}

// resourceValue is a resource field reference's value, as the kubelet
// computes it: the quantity divided by the divisor (default 1), rounded up.
func resourceValue(ctr corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resource %q", ref.Resource)
	}
	list := ctr.Resources.Requests
	if kind == "limits" {
		list = ctr.Resources.Limits
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok {
		return "0", nil // unset: the kubelet gives the node's allocatable; none here
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
}

// exec starts the container's process in a process group of its own.
func (r *Runner) exec(p *pod, ctr corev1.Container, env []string) (*Process, error) {
	command := ""
	if len(ctr.Command) > 0 {
		command = ctr.Command[0]
	}
	bin, err := r.o.Binary(ctr.Image, command)
	if err != nil {
		return nil, err
	}
	var args []string
	if len(ctr.Command) > 1 {
		args = append(args, ctr.Command[1:]...)
	}
	args = append(args, ctr.Args...)
	for i := range args {
		args[i] = p.rewrite(args[i])
	}
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	health, err := freePort()
	if err != nil {
		return nil, err
	}
	env = append(env, fmt.Sprintf("METRICS_PORT=%d", metrics), fmt.Sprintf("HEALTH_PROBE_PORT=%d", health))
	env = append(append(env, r.o.Env...), "PATH="+os.Getenv("PATH"))
	logPath := filepath.Join(r.o.Dir, p.namespace+"-"+p.name+".log")
	// Appended to: a container started again keeps its previous output.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = p.root
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	proc := &Process{Name: p.name, LogPath: logPath, HealthPort: health, MetricsPort: metrics, cmd: cmd, done: make(chan struct{}), probe: ctr.ReadinessProbe}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(proc.done)
	}()
	return proc, nil
}

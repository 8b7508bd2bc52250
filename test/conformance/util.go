package conformance

import (
	"io"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

func equalStatus(a, b *corev1.PodStatus) bool { return equality.Semantic.DeepEqual(a, b) }

// copyWorldLogs copies the world's logs (Cluster API controllers and
// simulators, kube-scheduler, kube-controller-manager) into dir when keep is
// set: the world's own directory goes away with it.
func copyWorldLogs(gw *groupWorld, dir string, keep bool) error {
	if !keep {
		return nil
	}
	for _, src := range gw.w.LogFiles() {
		if err := copyFile(src, filepath.Join(dir, filepath.Base(src))); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

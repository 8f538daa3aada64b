package chart

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// chartDir is the chart, relative to this package.
const chartDir = "../../deployments/helm/gpu-dra-driver"

// helmBinary is $HELM, or helm on PATH. Without one the test is skipped,
// except in CI ($CI set), where .ci/run builds helm before `make check`: a
// missing helm there must not pass silently.
func helmBinary(t *testing.T) string {
	t.Helper()
	if helm := os.Getenv("HELM"); helm != "" {
		return helm
	}
	if helm, err := exec.LookPath("helm"); err == nil {
		return helm
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no helm ($HELM or on PATH) in CI: hack/cluster/build.sh builds one and `make unit` passes it as HELM")
	}
	t.Skip("SKIP: no helm ($HELM or on PATH) to render the chart; hack/cluster/build.sh builds one")
	return ""
}

// helm runs helm with args and returns its combined output; the error
// includes the command line and the output.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, helmBinary(t), args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

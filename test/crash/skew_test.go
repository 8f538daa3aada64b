package crash

import (
	"cmp"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
)

// previousRelease is the release the skew test rolls back to and forward
// from: main before this release's checkpoint changes. Move it forward to
// the last release when a new one is cut; GPU_DRA_SKEW_COMMIT overrides it.
const previousRelease = "05319b92cb6a61503b1e612dd5ee59cd02f1b363"

const envSkewCommit = "GPU_DRA_SKEW_COMMIT"

// TestVersionSkew runs the plugin of the previous release (built from git
// history) and of this one, in turn, on the same node: claims prepared by
// either are found, returned and unprepared by the other, and nothing is
// leaked or destroyed that is in use. N-1 → N → N-1 → N.
func TestVersionSkew(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the version skew test in -short mode: it builds the previous release")
	}
	commit := cmp.Or(os.Getenv(envSkewCommit), previousRelease)
	old := buildRelease(t, commit)
	dirs, a, c := recoverySetup(t) // MIG claims on GPUs 0 and 1
	ctx := context.Background()
	run := func(bin string, what string, f func(*childproc.Child)) {
		t.Helper()
		t.Logf("%s: %s", releaseName(bin, commit), what)
		ch := startChildOf(t, bin, dirs, "")
		f(ch)
		stopChild(t, ch)
	}
	prepare := func(ch *childproc.Child, claim *resourceapi.ResourceClaim) []string {
		t.Helper()
		ids, err := ch.Kubelet.PrepareOne(ctx, claim)
		if err != nil {
			t.Fatalf("prepare %s: %v\n%s", claim.Name, err, pluginLog(dirs))
		}
		return ids
	}
	unprepare := func(ch *childproc.Child, claim *resourceapi.ResourceClaim) {
		t.Helper()
		if err := ch.Kubelet.UnprepareOne(ctx, claim); err != nil {
			t.Fatalf("unprepare %s: %v\n%s", claim.Name, err, pluginLog(dirs))
		}
	}
	same := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: CDI device IDs %v, want the recorded %v", what, got, want)
		}
	}
	instances := func(gpu, want int) {
		t.Helper()
		if got := simInstances(t, dirs, gpu); len(got) != want {
			t.Fatalf("MIG instances on GPU %d = %+v, want %d", gpu, got, want)
		}
	}

	var idsA, idsC []string
	run(old, "prepare A", func(ch *childproc.Child) { idsA = prepare(ch, a) })
	run(os.Args[0], "upgrade: A is found; prepare C", func(ch *childproc.Child) {
		same("A after the upgrade", prepare(ch, a), idsA)
		idsC = prepare(ch, c)
	})
	run(old, "rollback: unprepare A and C (C was prepared by the new release), prepare C again", func(ch *childproc.Child) {
		same("A after the rollback", prepare(ch, a), idsA)
		same("C after the rollback", prepare(ch, c), idsC)
		unprepare(ch, a)
		instances(0, 0)
		unprepare(ch, c)
		instances(1, 0)
		// The old release does not know MIG intents: the one the new
		// release wrote for C stays, and now names the old release's
		// instance at the same place, which is in use.
		same("C prepared by the old release", prepare(ch, c), idsC)
	})
	run(os.Args[0], "upgrade again: C's instance is in use, not leaked; unprepare C", func(ch *childproc.Child) {
		instances(1, 1)
		same("C after the second upgrade", prepare(ch, c), idsC)
		unprepare(ch, c)
		instances(1, 0)
	})
	checkConsistent(t, dirs, a.UID)
	checkConsistent(t, dirs, c.UID)
	if completed(t, dirs, a.UID) || completed(t, dirs, c.UID) || hasSpec(t, dirs, a.UID) || hasSpec(t, dirs, c.UID) {
		t.Errorf("claims left prepared at the end")
	}
	if intents, _ := filepath.Glob(filepath.Join(dirs.PluginData, "mig-intents", "*.json")); len(intents) != 0 {
		t.Errorf("MIG intents left at the end: %v", intents)
	}
}

func releaseName(bin, commit string) string {
	if bin == os.Args[0] {
		return "this release"
	}
	return "release " + commit[:min(len(commit), 12)]
}

// buildRelease builds this package's test binary at commit, which doubles
// as that release's plugin (see TestMain), once per commit into
// bin/skew/<commit>/ of the repository. It skips the test, saying why,
// where git history or the toolchain is not available.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("skipping: not in a git work tree (%v), so the previous release cannot be built", err)
	}
	root := strings.TrimSpace(string(out))
	full, err := exec.Command("git", "-C", root, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err != nil {
		t.Skipf("skipping: commit %s is not in this clone's history (shallow clone?); fetch it or set %s", commit, envSkewCommit)
	}
	commit = strings.TrimSpace(string(full))
	bin := filepath.Join(root, "bin", "skew", commit, "crash.test")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("skipping: no go tool to build release %s: %v", commit, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	src := t.TempDir()
	extract := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, "extract", root, commit, src)
	if out, err := extract.CombinedOutput(); err != nil {
		t.Fatalf("extract release %s: %v\n%s", commit, err, out)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o750); err != nil {
		t.Fatal(err)
	}
	tmp := bin + ".tmp"
	t.Logf("Building release %s (once; cached in %s)", commit, filepath.Dir(bin))
	build := exec.CommandContext(ctx, goTool, "test", "-c", "-o", tmp, "./test/crash")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			t.Fatalf("building release %s took too long", commit)
		}
		t.Fatalf("build release %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

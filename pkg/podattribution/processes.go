package podattribution

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// refreshInterval is how often, at most, a pod is read again because one
// of its processes runs in a container its last read did not list (the
// pod was read at prepare, before its containers started).
const refreshInterval = 10 * time.Second

// ProcessOwner is the pod and container a process runs in.
type ProcessOwner struct {
	PodUID types.UID
	// ContainerID is the runtime's container ID (no "containerd://").
	ContainerID string
}

// Processes finds the pod and container of a process on a GPU from its
// cgroup (/proc/<pid>/cgroup of the host: the plugin runs with hostPID),
// reading it once per process. A process is its PID and its start time
// (/proc/<pid>/stat): a PID reused between two scrapes is another process,
// whose cgroup is read afresh, never credited to the old one's pod. A
// container it finds that the Attribution does not know yet makes the
// Attribution read the pod again, so that the container's name becomes
// known.
type Processes struct {
	procRoot    string
	attribution *Attribution

	mu    sync.Mutex
	cache map[uint32]cachedOwner
	// reads counts cgroup file reads, for tests and benchmarks.
	reads atomic.Int64
}

type cachedOwner struct {
	start uint64 // the process's start time, in clock ticks since boot
	owner ProcessOwner
	ok    bool
}

// NewProcesses returns a Processes reading procRoot (usually /proc);
// attribution, if set, is asked to learn the containers it finds.
func NewProcesses(procRoot string, attribution *Attribution) *Processes {
	return &Processes{procRoot: procRoot, attribution: attribution, cache: map[uint32]cachedOwner{}}
}

// Owner returns the pod and container process pid runs in; false when it
// runs in no pod or is gone.
func (p *Processes) Owner(pid uint32) (ProcessOwner, bool) {
	start, err := p.startTime(pid)
	if err != nil {
		return ProcessOwner{}, false // gone, or not visible: no pod
	}
	p.mu.Lock()
	c, cached := p.cache[pid]
	p.mu.Unlock()
	if !cached || c.start != start {
		c = p.read(pid, start)
		p.mu.Lock()
		p.cache[pid] = c
		p.mu.Unlock()
	}
	if c.ok && p.attribution != nil {
		p.attribution.learnContainer(c.owner.PodUID, c.owner.ContainerID)
	}
	return c.owner, c.ok
}

// Keep forgets the PIDs not in pids, so the cache holds only the
// processes on GPUs.
func (p *Processes) Keep(pids map[uint32]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for pid := range p.cache {
		if !pids[pid] {
			delete(p.cache, pid)
		}
	}
}

// Reads returns how many cgroup files were read.
func (p *Processes) Reads() int64 { return p.reads.Load() }

// read reads the cgroup of process pid that started at start. A process
// that is gone by the end of the read (its PID may be another's already)
// has no pod.
func (p *Processes) read(pid uint32, start uint64) cachedOwner {
	p.reads.Add(1)
	data, err := os.ReadFile(filepath.Join(p.procDir(pid), "cgroup"))
	if err != nil {
		return cachedOwner{start: start} // gone, or not visible: no pod
	}
	if after, err := p.startTime(pid); err != nil || after != start {
		return cachedOwner{start: start}
	}
	owner, err := ParseCgroup(string(data))
	return cachedOwner{start: start, owner: owner, ok: err == nil}
}

func (p *Processes) procDir(pid uint32) string {
	return filepath.Join(p.procRoot, strconv.FormatUint(uint64(pid), 10))
}

// startTime returns when process pid started, from its stat file.
func (p *Processes) startTime(pid uint32) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(p.procDir(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return ParseStartTime(string(data))
}

// ParseStartTime returns the start time (field 22, clock ticks after boot)
// in the content of a /proc/<pid>/stat file. The command name (field 2)
// is in parentheses and may hold spaces and parentheses itself, so the
// fields are counted after its last ')'.
func ParseStartTime(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", firstLine(stat))
	}
	fields := strings.Fields(stat[i+1:])
	const startTime = 22 - 3 // fields after the name start at field 3 (state)
	if len(fields) <= startTime {
		return 0, fmt.Errorf("%d fields after the command name in %q, want over %d", len(fields), firstLine(stat), startTime)
	}
	start, err := strconv.ParseUint(fields[startTime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("start time (field 22): %w", err)
	}
	return start, nil
}

// ParseCgroup finds the pod UID and container ID in the content of a
// /proc/<pid>/cgroup file, as the kubelet's cgroup drivers name them:
//
//	cgroupfs: /kubepods/burstable/pod<uid>/<container-id>
//	systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<container-id>.scope
//
// on cgroup v1 (one line per hierarchy) and v2 ("0::<path>") alike. The
// container ID is empty for a process in the pod's own cgroup.
func ParseCgroup(content string) (ProcessOwner, error) {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; the path may contain ':'.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if owner, ok := parseCgroupPath(parts[2]); ok {
			return owner, nil
		}
	}
	return ProcessOwner{}, fmt.Errorf("no pod cgroup in %q", firstLine(content))
}

func parseCgroupPath(path string) (ProcessOwner, bool) {
	segments := strings.Split(strings.Trim(path, "/"), "/")
	for i, seg := range segments {
		uid, ok := podSegment(seg)
		if !ok {
			continue
		}
		owner := ProcessOwner{PodUID: types.UID(uid)}
		if i+1 < len(segments) {
			owner.ContainerID = containerSegment(segments[i+1])
		}
		return owner, true
	}
	return ProcessOwner{}, false
}

// podSegment returns the pod UID of a cgroupfs ("pod<uid>") or systemd
// ("kubepods-<qos>-pod<uid_>.slice", "kubepods-pod<uid_>.slice") segment.
func podSegment(seg string) (string, bool) {
	if rest, ok := strings.CutSuffix(seg, ".slice"); ok {
		i := strings.LastIndex(rest, "-pod")
		if !strings.HasPrefix(rest, "kubepods") || i < 0 {
			return "", false
		}
		return validUID(strings.ReplaceAll(rest[i+len("-pod"):], "_", "-"))
	}
	if rest, ok := strings.CutPrefix(seg, "pod"); ok {
		return validUID(rest)
	}
	return "", false
}

// validUID accepts the 36-character form pods' UIDs have.
func validUID(s string) (string, bool) {
	if len(s) != 36 || strings.Count(s, "-") != 4 {
		return "", false
	}
	for _, r := range s {
		if r != '-' && !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return "", false
		}
	}
	return s, true
}

// containerSegment strips the runtime's systemd scope decoration from a
// container's cgroup name: cri-containerd-<id>.scope, crio-<id>.scope,
// docker-<id>.scope.
func containerSegment(seg string) string {
	if rest, ok := strings.CutSuffix(seg, ".scope"); ok {
		if i := strings.LastIndex(rest, "-"); i >= 0 {
			return rest[i+1:]
		}
		return rest
	}
	return seg
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// learnContainer reads the pod again when containerID is none of the IDs
// its last read listed, at most every refreshInterval.
func (a *Attribution) learnContainer(podUID types.UID, containerID string) {
	if a.pods == nil || containerID == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	claims, known := a.known[podUID]
	if !known || time.Since(a.lookedUp[podUID]) < refreshInterval {
		return // a lookup is pending, or was just done
	}
	for _, uses := range claims {
		for _, u := range uses {
			for _, id := range u.ContainerIDs {
				if id == containerID {
					return
				}
			}
		}
	}
	ref, ok := a.refLocked(podUID)
	if !ok {
		return
	}
	a.lookedUp[podUID] = time.Now() // one refresh per interval, whatever it finds
	a.stale[podUID] = true
	a.queue.Add(ref)
}

// refLocked returns the reference of a pod a recorded claim is reserved for.
func (a *Attribution) refLocked(uid types.UID) (podRef, bool) {
	for _, c := range a.claims {
		for _, p := range c.pods {
			if p.UID == uid {
				return p, true
			}
		}
	}
	return podRef{}, false
}

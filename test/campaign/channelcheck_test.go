package campaign

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/imexd"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// domainDaemon is what the node has of one compute domain's IMEX daemon, as
// test/node reads it: the daemon's state directory (pkg/imex: one per
// domain UID, with its record domain.json) and the imex-sim processes
// running its config.
type domainDaemon struct {
	dir bool
	// rec is the record; nil when there is none.
	rec *struct {
		Claims []string `json:"claims"`
		PID    int      `json:"pid"`
	}
	pids []int
}

func imexStateDir(dirs pluginrun.Dirs) string { return filepath.Join(dirs.PluginData, "imex") }

// readIMEX reads the daemons' state directories and finds the running
// daemons by their command line (nvidia-imex -c <state dir>/<UID>/config.cfg),
// by domain UID. The plugin's poller runs nvidia-imex-ctl with the same
// config: that is no daemon.
func readIMEX(dirs pluginrun.Dirs) (map[string]*domainDaemon, error) {
	out := map[string]*domainDaemon{}
	get := func(uid string) *domainDaemon {
		if out[uid] == nil {
			out[uid] = &domainDaemon{}
		}
		return out[uid]
	}
	state := imexStateDir(dirs)
	entries, err := os.ReadDir(state)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		d := get(e.Name())
		d.dir = true
		data, err := os.ReadFile(filepath.Join(state, e.Name(), "domain.json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = json.Unmarshal(data, &d.rec)
		}
		if err != nil {
			return nil, fmt.Errorf("IMEX daemon record of %s: %w", e.Name(), err)
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !running(pid) {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
		if filepath.Base(args[0]) == imexd.CtlName {
			continue
		}
		if i := slices.Index(args, "-c"); i >= 0 && i+1 < len(args) {
			cfg := args[i+1]
			if filepath.Dir(filepath.Dir(cfg)) == state && filepath.Base(cfg) == "config.cfg" {
				d := get(filepath.Base(filepath.Dir(cfg)))
				d.pids = append(d.pids, pid)
			}
		}
	}
	return out, nil
}

// running: a zombie has exited.
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// checkChannels checks the compute domains' invariants. A prepared channel
// claim is completed with its channel's record (the checks of every claim
// cover its entry and spec) and its spec gives the channel's device node.
// A domain's daemon runs on the node exactly while the checkpoint holds a
// channel of the domain, once, as long as one of its claims is prepared and
// never without a live claim of it, and its record lists every prepared claim
// of the domain and no claim the kubelet unprepared; one domain's daemon runs
// at a time. No channel is held by claims of two domains.
func (r *run) checkChannels(v *nodeView, fail func(string, ...any)) {
	ready, live := map[string][]string{}, map[string]bool{}
	for _, c := range r.sortedClaims() {
		if c.kind != kindChannel {
			continue
		}
		uid := string(domainUID(c.domain))
		live[uid] = true
		if c.state != prepared {
			continue
		}
		ready[uid] = append(ready[uid], c.uid())
		r.checkChannelClaim(v, c, fail)
	}
	// The checkpoint's channels, of any claim: by domain and by channel.
	held := map[string]bool{}
	holders := map[int]map[string][]string{} // channel -> domain -> claims
	for uid, e := range v.cp.All() {
		for _, d := range e.Devices {
			ch := d.IMEXChannel
			if d.Kind != vocabulary.KindIMEXChannel || ch == nil {
				continue
			}
			if ch.DomainUID != "" {
				held[ch.DomainUID] = true
			}
			if holders[ch.Channel] == nil {
				holders[ch.Channel] = map[string][]string{}
			}
			domain := ch.DomainNamespace + "/" + ch.DomainName
			holders[ch.Channel][domain] = append(holders[ch.Channel][domain], string(uid))
		}
	}
	for _, ch := range slices.Sorted(maps.Keys(holders)) {
		if len(holders[ch]) > 1 {
			fail("IMEX %s is held by claims of %d ComputeDomains: %v", vocabulary.ChannelDeviceName(ch), len(holders[ch]), holders[ch])
		}
	}
	uids := slices.Collect(maps.Keys(v.imex))
	for uid := range held {
		if v.imex[uid] == nil {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	var runs []string
	for _, uid := range uids {
		d := v.imex[uid]
		if d == nil {
			d = &domainDaemon{}
		}
		if len(d.pids) > 0 {
			runs = append(runs, uid)
		}
		if len(d.pids) > 1 {
			fail("%d IMEX daemons of ComputeDomain %s run: pids %v", len(d.pids), uid, d.pids)
		}
		if !live[uid] && (d.dir || len(d.pids) > 0) {
			fail("leak: the IMEX daemon of ComputeDomain %s (pids %v, files %v) is left with no live channel claim of it", uid, d.pids, d.dir)
		}
		if held[uid] != (len(d.pids) > 0) || d.dir != (len(d.pids) > 0) {
			fail("ComputeDomain %s: the checkpoint holds it: %v, its daemon runs: %v (pids %v), its files exist: %v", uid, held[uid], len(d.pids) > 0, d.pids, d.dir)
		}
		if d.rec == nil {
			if len(d.pids) > 0 {
				fail("the IMEX daemon of ComputeDomain %s (pids %v) runs without its record", uid, d.pids)
			}
			continue
		}
		if len(d.pids) > 0 && !slices.Contains(d.pids, d.rec.PID) {
			fail("the IMEX daemon record of ComputeDomain %s names pid %d, the daemon is %v", uid, d.rec.PID, d.pids)
		}
		for _, claim := range d.rec.Claims {
			if c := r.claims[claim]; c == nil || c.kind != kindChannel || string(domainUID(c.domain)) != uid {
				fail("leak: the IMEX daemon record of ComputeDomain %s lists claim %s, no live channel claim of the domain", uid, claim)
			}
		}
	}
	if len(runs) > 1 {
		fail("IMEX daemons of %d ComputeDomains run on the node, which serves one at a time: %v", len(runs), runs)
	}
	for _, uid := range slices.Sorted(maps.Keys(ready)) {
		d := v.imex[uid]
		switch {
		case d == nil || len(d.pids) == 0:
			fail("claim lost: no IMEX daemon of ComputeDomain %s runs for its prepared channel claims %v", uid, ready[uid])
		case d.rec == nil:
		default:
			for _, claim := range ready[uid] {
				if !slices.Contains(d.rec.Claims, claim) {
					fail("claim lost: the IMEX daemon record of ComputeDomain %s does not list prepared channel claim %s (lists %v)", uid, claim, d.rec.Claims)
				}
			}
		}
	}
}

// checkChannelClaim: a prepared channel claim's checkpoint record names its
// channel and domain, and its CDI device gives the channel's device node.
func (r *run) checkChannelClaim(v *nodeView, c *claim, fail func(string, ...any)) {
	results := c.obj.Status.Allocation.Devices.Results
	if len(results) != 1 {
		fail("channel claim %s has %d devices allocated, want one", c.obj.Name, len(results))
		return
	}
	n, err := vocabulary.ChannelNumber(results[0].Device)
	if err != nil {
		fail("channel claim %s: %v", c.obj.Name, err)
		return
	}
	if e, ok := v.cp.Get(c.obj.UID); ok && e.State == checkpoint.PrepareCompleted && len(e.Devices) == 1 {
		ch := e.Devices[0].IMEXChannel
		if ch == nil || ch.Channel != n || ch.DomainName != c.domain || ch.DomainUID != string(domainUID(c.domain)) {
			fail("claim lost: prepared channel claim %s (channel %d of %s) is recorded as %+v", c.obj.Name, n, c.domain, ch)
		}
	}
	node := vocabulary.ChannelDevNode(n)
	for _, id := range c.ids {
		if dev := v.cache.GetDevice(id); dev != nil {
			for _, dn := range dev.ContainerEdits.DeviceNodes {
				if dn.Path == node {
					return
				}
			}
		}
	}
	fail("claim lost: no CDI device %v of prepared channel claim %s gives %s", c.ids, c.obj.Name, node)
}

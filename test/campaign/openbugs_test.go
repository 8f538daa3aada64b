package campaign

import (
	"fmt"
	"slices"
	"strings"
)

// openBugs name the fault kinds that hit crash-safety bugs open in
// pkg/prepare when the campaign was written (see the package doc); all of
// them have been fixed since, and the switches stay to isolate a
// regression. They are on by default; -open-bugs=none runs the campaign
// without them.
var openBugs = []string{
	bugKillInRecovery, bugDamagedCheckpointMidway, bugLostGPUAtRestart,
	bugReallocate, bugDeletedCheckpoint, bugRebuiltCheckpoint,
}

const (
	// A kill in the middle of start-up recovery (known: a crash during
	// checkpoint recovery forgets claims).
	bugKillInRecovery = "kill-in-recovery"
	// A damaged checkpoint while a claim is half prepared or unprepared
	// (known: a corrupt checkpoint leaks a MIG instance being prepared).
	bugDamagedCheckpointMidway = "damaged-checkpoint-midway"
	// A GPU lost across a restart (known: one lost GPU at restart makes
	// the plugin fail to start, a crash loop).
	bugLostGPUAtRestart = "lost-gpu-at-restart"
	// A claim whose prepare failed, prepared again with a new allocation
	// (known: re-prepare with a changed allocation).
	bugReallocate = "reallocate"
	// A deleted checkpoint (found by this campaign: the specs of all
	// prepared claims are removed as orphans, the claims forgotten and
	// their MIG instances leaked).
	bugDeletedCheckpoint = "deleted-checkpoint"
	// A damaged checkpoint while claims are prepared (found by this
	// campaign: entries rebuilt from CDI specs lack the GPU UUID and the
	// sharing record, so a later interrupted unprepare of a share makes
	// recovery fail, a crash loop; seen once: a rebuilt MIG claim whose
	// spec is damaged later is not rewritten, "device ... is no longer
	// present on this node").
	bugRebuiltCheckpoint = "rebuilt-checkpoint"
)

// parseOpenBugs returns the enabled open-bug fault kinds.
func parseOpenBugs(v string) (map[string]bool, error) {
	on := map[string]bool{}
	switch v {
	case "all":
		for _, b := range openBugs {
			on[b] = true
		}
	case "none", "":
	default:
		for _, b := range strings.Split(v, ",") {
			if !slices.Contains(openBugs, b) {
				return nil, fmt.Errorf("-open-bugs: unknown fault kind %q, valid: all, none, %s", b, strings.Join(openBugs, ", "))
			}
			on[b] = true
		}
	}
	return on, nil
}

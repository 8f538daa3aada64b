package prepare

// Fault points passed to Options.FaultHook: each names the step just done,
// between two side effects, so a crash test can kill the process there.
const (
	FaultPrepareStarted    = "prepare:started-recorded"
	FaultPrepareMIGCreated = "prepare:mig-created"
	FaultPrepareVFIOBound  = "prepare:vfio-bound"
	FaultPrepareCDIWritten = "prepare:cdi-written"
	FaultPrepareCompleted  = "prepare:completed-recorded"
	FaultUnprepareStarted  = "unprepare:started-recorded"
	FaultUnprepareCDIGone  = "unprepare:cdi-removed"
	FaultUnprepareDone     = "unprepare:forgotten"

	// Recovery at start, in New: each fires only when the node's state
	// calls for its step (a corrupt or missing checkpoint, a preparation
	// to roll back, an orphaned spec, a leaked MIG instance).
	FaultRecoverCorruptCopied = "recover:corrupt-copied"
	FaultRecoverRebuiltSaved  = "recover:rebuilt-saved"
	FaultRecoverRolledBack    = "recover:rolled-back"
	FaultRecoverOrphanRemoved = "recover:orphan-removed"
	// A MIG instance whose record was lost is destroyed, its intent not
	// yet removed.
	FaultRecoverLeakedMIGDestroyed = "recover:leaked-mig-destroyed"

	// FaultCheckpointSaving is reached with the save lock held, just
	// before a group commit's save: a hook that blocks there is a hung
	// save (the probes' tests). It is not in FaultPoints, so the crash
	// campaigns do not grow: a crash there leaves the checkpoint without
	// the change, as a crash during the step before the save does.
	FaultCheckpointSaving = "checkpoint:saving"
)

// FaultPoints lists every fault point the driver passes to
// Options.FaultHook, for fault campaigns that visit them all.
var FaultPoints = []string{
	FaultPrepareStarted,
	FaultPrepareMIGCreated,
	FaultPrepareVFIOBound,
	FaultPrepareIMEXDomainRecorded,
	FaultPrepareCDIWritten,
	FaultPrepareCompleted,
	FaultUnprepareStarted,
	FaultUnprepareCDIGone,
	FaultUnprepareDone,
	FaultRecoverCorruptCopied,
	FaultRecoverRebuiltSaved,
	FaultRecoverRolledBack,
	FaultRecoverOrphanRemoved,
	FaultRecoverLeakedMIGDestroyed,
}

func (d *Engine) fault(point string) {
	if d.opts.FaultHook != nil {
		d.opts.FaultHook(point)
	}
}

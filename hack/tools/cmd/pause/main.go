// Command pause is the sandbox ("infra") container of the local cluster.
//
// It sleeps until SIGINT or SIGTERM and reaps every child that is re-parented to it,
// which is all a pod sandbox process has to do. Built statically (CGO_ENABLED=0), it
// replaces registry.k8s.io/pause on machines that cannot reach a registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

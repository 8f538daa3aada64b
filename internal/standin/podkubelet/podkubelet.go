// Package podkubelet stands in for a node's kubelet over a fake clientset:
// it runs the pods created in a namespace as local processes and reports
// their phase, so that code which launches pods (pkg/mpspod) can be tested
// without a cluster.
package podkubelet

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

// Kubelet runs the first container of every pod created in a namespace as
// a local process (command and env only: no image, mounts or namespaces),
// records its phase, and stops it (SIGTERM, then SIGKILL) when the pod is
// deleted: enough to run pods whose work is a host process, such as MPS
// control daemons in the host's PID namespace.
type Kubelet struct {
	client *fake.Clientset
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	procs map[types.UID]*os.Process
	wg    sync.WaitGroup
}

// Start watches namespace ns of client.
func Start(client *fake.Clientset, ns string) (*Kubelet, error) {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		return nil, err
	}
	k := &Kubelet{client: client, cancel: cancel, done: make(chan struct{}), procs: map[types.UID]*os.Process{}}
	go func() {
		defer close(k.done)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				pod, isPod := ev.Object.(*corev1.Pod)
				switch {
				case !isPod:
				case ev.Type == watch.Added:
					k.run(pod)
				case ev.Type == watch.Deleted:
					k.kill(pod.UID)
				}
			}
		}
	}()
	return k, nil
}

func (k *Kubelet) run(pod *corev1.Pod) {
	c := pod.Spec.Containers[0]
	cmd := exec.Command(c.Command[0], append(c.Command[1:], c.Args...)...)
	cmd.Env = []string{}
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		// As runc reports a missing executable.
		k.setStatus(pod, corev1.PodFailed, &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error()})
		return
	}
	k.mu.Lock()
	k.procs[pod.UID] = cmd.Process
	k.mu.Unlock()
	k.setStatus(pod, corev1.PodRunning, nil)
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		exit := corev1.PodSucceeded
		if cmd.Wait() != nil {
			exit = corev1.PodFailed
		}
		k.mu.Lock()
		delete(k.procs, pod.UID)
		k.mu.Unlock()
		k.setStatus(pod, exit, &corev1.ContainerStateTerminated{ExitCode: int32(cmd.ProcessState.ExitCode()), Reason: string(exit)})
	}()
}

// setStatus records the pod's phase and, when it ended, its container's
// end.
func (k *Kubelet) setStatus(pod *corev1.Pod, phase corev1.PodPhase, ended *corev1.ContainerStateTerminated) {
	cur, err := k.client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil || cur.UID != pod.UID {
		return
	}
	cur.Status.Phase = phase
	if ended != nil {
		cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, State: corev1.ContainerState{Terminated: ended}}}
	}
	_, _ = k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), cur, metav1.UpdateOptions{})
}

func (k *Kubelet) kill(uid types.UID) {
	k.mu.Lock()
	p := k.procs[uid]
	k.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	go func() {
		time.Sleep(5 * time.Second)
		_ = p.Kill()
	}()
}

// Stop stops watching and kills the processes still running.
func (k *Kubelet) Stop() {
	k.cancel()
	<-k.done
	k.mu.Lock()
	for _, p := range k.procs {
		_ = p.Kill()
	}
	k.mu.Unlock()
	k.wg.Wait()
}

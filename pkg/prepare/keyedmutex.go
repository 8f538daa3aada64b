package prepare

import "github.com/gpu-dra/gpu-dra-driver/pkg/keyedmutex"

// keyedMutex is the engine's lock per physical GPU (pkg/keyedmutex), so
// work on different GPUs runs in parallel while work on one GPU is
// serialized; lock takes several GPUs in an order that rules out deadlocks.
type keyedMutex struct{ keyedmutex.Mutex }

func newKeyedMutex() *keyedMutex { return &keyedMutex{} }

func (k *keyedMutex) lock(keys ...string) func() { return k.Lock(keys...) }

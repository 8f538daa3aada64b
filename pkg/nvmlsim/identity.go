package nvmlsim

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// digest hashes the parts with separators so that ("ab","c") and ("a","bc") differ.
func digest(parts ...string) [sha256.Size]byte {
	return sha256.Sum256([]byte(strings.Join(parts, "\x00")))
}

func formatUUID(b []byte) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// gpuUUID is GPU index's UUID on machine for seed, e.g. "GPU-1c6e4a5b-...". Real GPU UUIDs are
// opaque 128-bit values, so all bits come from the hash.
func gpuUUID(seed, machine string, index int) string {
	sum := digest("nvmlsim-gpu", seed, machine, fmt.Sprint(index))
	return "GPU-" + formatUUID(sum[:16])
}

// migUUID is the UUID of the MIG device of compute instance ci in GPU instance gi on the GPU with
// UUID parent. Real MIG UUIDs are version-5 UUIDs (e.g. MIG-c7384736-a75d-5afc-978f-...), stable
// for the same GPU, GPU instance and compute instance, so the version and variant bits are set.
func migUUID(parent string, gi, ci uint32) string {
	sum := digest("nvmlsim-mig", parent, fmt.Sprint(gi), fmt.Sprint(ci))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return "MIG-" + formatUUID(b)
}

// clusterUUID is the NVLink fabric cluster UUID of machine for seed.
func clusterUUID(seed, machine string) [16]uint8 {
	sum := digest("nvmlsim-fabric", seed, machine)
	var out [16]uint8
	copy(out[:], sum[:16])
	return out
}

// boardSerial is a 13-digit board serial number like the ones NVIDIA prints on data-center GPUs.
func boardSerial(seed, machine string, index int) string {
	sum := digest("nvmlsim-serial", seed, machine, fmt.Sprint(index))
	n := uint64(0)
	for _, b := range sum[:8] {
		n = n<<8 | uint64(b)
	}
	return fmt.Sprintf("16%011d", n%100000000000)
}

// How a worker's C heap keeps what LibTorch frees (design: launch,
// "Devices").
#pragma once

namespace ob::launch {

// Makes glibc's malloc keep the memory this process frees for its next
// allocations, as a GPU's caching allocator does, instead of handing it
// back to the kernel: no mmap for large blocks, no trim of the heap's top.
// On the CPU a training step frees and allocates its activations and
// gradients over and over, and with glibc's defaults each new large tensor
// is fresh pages, each page a fault (GPT-2-sized blocks on one core: 30% of
// a step; design/launch.md). The resident size then stays at its peak.
// Leaves glibc's defaults where the environment sets any of its own
// (MALLOC_MMAP_THRESHOLD_, MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_TOP_PAD_, or a malloc tunable in GLIBC_TUNABLES): the user's
// choice wins. Returns whether it changed them.
bool KeepFreedMemory();

}  // namespace ob::launch

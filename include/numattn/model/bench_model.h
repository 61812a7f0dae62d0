/// @file bench_model.h
/// Measurements behind `numattn bench-model` and `generate`: the process's peak resident
/// memory, and the machine's streaming-read bandwidth (the roofline of a decode step, which
/// reads every weight once per token).
#pragma once

#include <cstdint>

#include "numattn/core/exec.h"

namespace numattn {

/// Peak resident set size of this process so far, in bytes (getrusage ru_maxrss; 0 when the
/// OS does not report it). Counts the mapped file's pages that were touched.
std::uint64_t peak_resident_bytes();

/// Streaming-read bandwidth in bytes/s: `threads` threads each sum their contiguous slice of a
/// buffer of `bytes` bytes (float32, vectorised, 8 independent sums), `reps` times; the median
/// rep is returned. Choose `bytes` larger than the last-level cache so the reads come from
/// DRAM; the buffer is written once first (so its pages exist) and freed afterwards. Throws
/// numattn::Error when `bytes` < 1 MiB, `reps` < 1, or the buffer does not fit in the available
/// memory.
double measure_read_bandwidth(std::uint64_t bytes, int reps, const ExecContext& ctx);

/// Size of the last-level cache in bytes, from sysfs (0 when unknown).
std::uint64_t last_level_cache_bytes();

}  // namespace numattn

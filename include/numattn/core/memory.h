/// @file memory.h
/// Checked size arithmetic and the available-memory guard that every big allocation from
/// untrusted sizes (file metadata, flags) goes through.
///
/// Sizes that come from a file or a user are multiplied with `checked_mul` (never plain `*`):
/// an overflow is a user mistake (a hostile or corrupt input) and raises `numattn::Error` naming
/// what was being sized, not a wrapped value that later becomes a 4 GB `resize`.
///
/// Before allocating, `check_memory(bytes, what)` compares the estimated need with the memory
/// the machine has available now and refuses, naming both numbers, when it does not fit: the
/// alternative is `std::bad_alloc` at best and the kernel's OOM killer at worst.
///
/// Available memory: `MemAvailable` of /proc/meminfo (what the kernel estimates can be
/// allocated without swapping), or `sysconf(_SC_AVPHYS_PAGES) · page size` where there is no
/// /proc. The environment variable `NUMATTN_MEMORY_AVAILABLE` (a byte count, decimal) replaces
/// the measurement: tests use it to exercise the refusal on small inputs, and a user can use
/// it to cap what numattn will take on a shared machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <string_view>

#include "numattn/core/error.h"

namespace numattn {

/// A request for more memory than the machine has available (`check_memory`), or an
/// allocation that failed anyway: the message names what was being allocated and the bytes
/// asked for. Python maps it onto a MemoryError that is also a numattn.Error.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

/// a·b for sizes: throws numattn::Error naming `what` if either is negative or the product
/// overflows int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what);
/// a+b for sizes, same rules.
std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what);
/// Unsigned a·b: false (and *out unspecified) on overflow. For parsers that report overflow
/// with their own context (the GGUF reader names the byte offset).
bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out);

/// Bytes the machine can allocate now (see the file comment; the environment override wins).
/// Throws numattn::Error when NUMATTN_MEMORY_AVAILABLE is set but not a byte count.
std::uint64_t available_memory_bytes();

/// Throws numattn::OutOfMemory (a numattn::Error) "<what> needs X of memory but only Y are
/// available" when `bytes` exceeds available_memory_bytes().
void check_memory(std::uint64_t bytes, std::string_view what);

/// "1.50 GiB", "12.0 MiB", "512 B": a byte count for messages.
std::string format_bytes(std::uint64_t bytes);

/// Memory for large buffers read in scattered runs (a KV cache): blocks of at least 2 MiB are
/// mapped 2 MiB-aligned and advised as transparent huge pages (madvise MADV_HUGEPAGE, where
/// the kernel offers them: Linux's default THP mode, `madvise`, gives none otherwise), so that
/// reading a few rows here and there costs no page walk per 4 KiB page; smaller ones come from
/// operator new. Every block starts on a 64-byte boundary (a cache line: SIMD rows at offsets
/// that are multiples of 64 stay aligned). Throws std::bad_alloc when the mapping fails. A hint, never a requirement: the
/// contents and the behaviour are the same with or without huge pages.
void* huge_page_alloc(std::size_t bytes);
void huge_page_free(void* p, std::size_t bytes) noexcept;

/// A large temporary buffer (64-byte aligned, uninitialised) that outlives its call: the
/// block a ScratchBlock releases is kept (one block, the largest released, up to
/// scratch_keep_limit() bytes) and handed to the next ScratchBlock that fits in it. Fresh
/// memory costs a page fault per 4 KiB page on first touch, about five times the cost of
/// filling it (32 MiB: 7 ms against 1.4 ms on 2 threads); a call repeated per layer or per
/// step (exact.flash's packed copy of strided K/V) reuses its block instead. Thread-safe: a
/// second block in use at the same time is allocated afresh. `release_scratch_memory()`
/// returns the kept block to the system (Python: `numattn.release_scratch_memory()`).
class ScratchBlock {
 public:
  explicit ScratchBlock(std::size_t bytes);
  ScratchBlock(const ScratchBlock&) = delete;
  ScratchBlock& operator=(const ScratchBlock&) = delete;
  ~ScratchBlock();
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  std::size_t cap_ = 0;
  bool keep_ = false;  ///< within scratch_keep_limit() when allocated
};

/// The most a released ScratchBlock keeps: 1 GiB, or a quarter of available_memory_bytes() at
/// the time the block was allocated when that is less.
std::size_t scratch_keep_limit();

/// Frees the block kept by ScratchBlock (if any); returns its size in bytes.
std::size_t release_scratch_memory() noexcept;

/// A standard allocator over huge_page_alloc (for std::vector).
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(huge_page_alloc(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { huge_page_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

}  // namespace numattn

/// @file dense_softmax.h
/// Exact float32 softmax attention on a smaller problem that a method assembles from its own
/// buffers (attention-specific building block).
///
/// Low-rank methods reduce attention to dense attention between few rows and many, or many rows
/// and few: Nyströmformer's softmax(Q̃Kᵀ)·V (m landmark queries over all keys) and
/// softmax(QK̃ᵀ)·W (all queries over m landmark keys), Linformer's softmax(Q(EK)ᵀ)·(FV). They all
/// run through this one entry, the flash block (blocks/flash.h) with its default blocking (tiled online softmax,
/// register-blocked SIMD kernels, its own parallel schedule over (batch, kv head, row block)
/// with key-range splitting when rows are few), so the reduced problems get the project's tuned
/// kernel and its GQA handling. `sub.scale` should be set explicitly (the default 1/sqrt(Dk) of
/// the sub-problem is rarely the caller's scale).
///
/// No edge handling: a NaN or ±inf reaching the kernel stays in the rows it touches (the caller's
/// `run` settles its own output), and no float64 fallback runs for logits beyond float32.
/// Cost: 2·rows·keys·(Dk+Dv) flops per head; workspace O(threads·64·(Dk+Dv+block_k)) floats.
#pragma once

#include <cstddef>

#include "numattn/attention/problem.h"
#include "numattn/core/exec.h"

namespace numattn::blocks {

/// Writes `sub.out` (and `sub.lse` when not empty). `sub` must satisfy `validate`.
void dense_softmax_attention(const AttentionProblem& sub, const ExecContext& ctx);

/// Bytes of workspace `dense_softmax_attention` allocates for `sub` on `threads` threads.
std::size_t dense_softmax_workspace_bytes(const AttentionProblem& sub, int threads);

}  // namespace numattn::blocks

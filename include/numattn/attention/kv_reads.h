/// @file kv_reads.h
/// The KV-cache rows an attention method reads: what a decode step costs in memory traffic.
#pragma once

#include "numattn/attention/method.h"

namespace numattn {

/// Keys whose K and V rows `m` reads for query row `i` of `p` (only shapes, causal rule and
/// window of `p` are used; its data may be null). sparse.window: its band ∪ sinks among the
/// visible keys; sparse.quest: sinks, recent window and chosen pages, plus its page summaries
/// counted as 2 rows per page; every other method: every key the causal rule and window leave
/// visible.
index_t kv_rows_read(const AttentionMethod& m, const AttentionProblem& p, index_t i);

}  // namespace numattn

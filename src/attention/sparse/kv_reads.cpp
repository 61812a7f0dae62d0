#include "numattn/attention/kv_reads.h"

#include "attention/sparse/quest.h"
#include "attention/sparse/window.h"

namespace numattn {

index_t kv_rows_read(const AttentionMethod& m, const AttentionProblem& p, index_t i) {
  if (const auto* w = dynamic_cast<const WindowAttention*>(&m)) return w->keys_read(p, i);
  if (const auto* q = dynamic_cast<const QuestAttention*>(&m)) return q->keys_read(p, i);
  const KeyRange r = p.key_range(i);
  return r.empty() ? 0 : r.end - r.begin;
}

}  // namespace numattn

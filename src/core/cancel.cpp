#include "numattn/core/cancel.h"

#include <csignal>

namespace numattn {

namespace {
// A signal handler may only touch lock-free atomics and volatile sig_atomic_t objects.
std::atomic<CancelToken*> g_sigint_token{nullptr};
void (*g_sigint_previous)(int) = SIG_DFL;

extern "C" void on_sigint(int sig) {
  CancelToken* t = g_sigint_token.load();
  if (t != nullptr && !t->requested()) {
    t->request();
    return;
  }
  // The second Ctrl-C: whatever the process did before (by default, die).
  std::signal(sig, g_sigint_previous);
  std::raise(sig);
}
}  // namespace

SigintCancel::SigintCancel(CancelToken& token) {
  NUMATTN_ASSERT(g_sigint_token.load() == nullptr);
  g_sigint_token.store(&token);
  previous_ = std::signal(SIGINT, on_sigint);
  if (previous_ == SIG_ERR) previous_ = SIG_DFL;
  // A process started with SIGINT ignored (a background job of a shell) keeps ignoring it.
  if (previous_ == SIG_IGN) std::signal(SIGINT, SIG_IGN);
  g_sigint_previous = previous_;
}

SigintCancel::~SigintCancel() {
  std::signal(SIGINT, previous_);
  g_sigint_token.store(nullptr);
}

}  // namespace numattn

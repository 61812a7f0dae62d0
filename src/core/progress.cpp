#include "numattn/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace numattn {

ProgressBar::ProgressBar(std::string label, std::int64_t total, Mode mode, double min_interval)
    : label_(std::move(label)),
      total_(std::max<std::int64_t>(total, 1)),
      enabled_(mode == Mode::kForce || (mode == Mode::kAuto && isatty(STDERR_FILENO) == 1)),
      min_interval_(min_interval),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::set(std::int64_t done, const std::string& status) {
  done_ = std::clamp<std::int64_t>(done, 0, total_);
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  // Redrawing on every step would flood a slow terminal; the final step is always shown.
  if (drawn_ && done_ < total_ && std::chrono::duration<double>(now - last_draw_).count() < min_interval_)
    return;
  last_draw_ = now;
  draw(status);
}

void ProgressBar::draw(const std::string& status) {
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  const double eta = done_ > 0 ? elapsed / static_cast<double>(done_) * static_cast<double>(total_ - done_) : 0;
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(kWidth * done_ / total_);
  std::string bar(static_cast<std::size_t>(fill), '#');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld  %.0fs", label_.c_str(), bar.c_str(),
               static_cast<long long>(done_), static_cast<long long>(total_), elapsed);
  if (done_ > 0 && done_ < total_) std::fprintf(stderr, "  ETA %.0fs", eta);
  if (!status.empty()) std::fprintf(stderr, "  %s", status.c_str());
  std::fprintf(stderr, "\033[K");  // clear what a longer previous line left
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) {
    std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace numattn

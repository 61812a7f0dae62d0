/// @file progress.h
/// A one-line progress bar on stderr for long commands (ppl, analyze, report, convert).
///
/// Drawn only when stderr is a terminal (isatty), so logs and pipes stay clean; `kForce` draws
/// anyway (tests), `kOff` never. Redraws at most every `min_interval` seconds (the last step is
/// always drawn), with the elapsed time and an ETA from the mean time per step so far.
/// Not thread-safe: one thread (the command's) calls step()/set().
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace numattn {

class ProgressBar {
 public:
  enum class Mode { kAuto, kForce, kOff };
  /// `label` prefixes the line (e.g. "ppl"); `total` steps (>= 1; 0 is taken as 1).
  ProgressBar(std::string label, std::int64_t total, Mode mode = Mode::kAuto,
              double min_interval = 0.2);
  ~ProgressBar();  ///< ends the line if anything was drawn
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Sets the number of steps done and an optional status text (e.g. "ppl 22.7  1500 tok/s").
  void set(std::int64_t done, const std::string& status = "");
  /// One more step done.
  void step(const std::string& status = "") { set(done_ + 1, status); }
  /// Whether this bar draws anything.
  bool enabled() const { return enabled_; }
  /// Ends the line now (later calls draw a new bar line).
  void finish();

 private:
  void draw(const std::string& status);
  std::string label_;
  std::int64_t total_ = 1, done_ = 0;
  bool enabled_ = false, drawn_ = false;
  double min_interval_ = 0.2;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace numattn

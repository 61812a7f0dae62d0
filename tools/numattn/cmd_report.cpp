// numattn report: the main job. Runs the measurements as child processes of this same executable
// (each a command the reader can rerun, printed in the report), writes their outputs under
// DIR/data/, then calls scripts/report_plots.py (Debian's python3 + matplotlib) for the plots,
// report.md and index.html.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "numattn/attention/registry.h"
#include "numattn/core/error.h"
#include "numattn/core/exec.h"
#include "numattn/core/file_io.h"
#include "numattn/core/progress.h"
#include "numattn/gguf/gguf.h"
#include "numattn/model/data.h"
#include "numattn/model/llama.h"
#include "numattn/transform/pipeline.h"

extern char** environ;

namespace numattn::cli {

namespace {

namespace fs = std::filesystem;

// The sizes of one report. Quick (the default) keeps the measurements to a few minutes on two
// cores; --full is the thorough one. Every field can be overridden by its flag.
struct Settings {
  std::string n, heads, d, tokens, layers, ppl_methods, bench_methods, bd_setups, mla_ranks,
      analyze_layers, long_n, long_methods, long_tol;
  int reps = 0, bd_seeds = 0;
  long long check_rows = 0, gemm_size = 0, bd_tokens = 0, analyze_tokens = 0;
  std::int64_t ctx = 0, chunks = 0, long_ctx = 0;
};

// The long-context section's configurations: each family's budget parameter swept, smallest
// budget first. All of them are timed on captured Q/K/V at every length; the model runs all of
// them in a full report and the middle budget of each family in a quick one. Methods without a
// causal kernel of their own reach the causal problems through their causal form.
struct LongFamily {
  const char* family;
  std::vector<std::string> specs;
};
const std::vector<LongFamily>& long_sweep() {
  static const std::vector<LongFamily> sweep{
      {"sparse.window", {"sparse.window(left=256,sinks=4)", "sparse.window(left=1024,sinks=4)",
                         "sparse.window(left=2048,sinks=4)"}},
      {"sparse.topk", {"sparse.topk(k=384,select=block,block=256,samples=8)",
                       "sparse.topk(k=640,select=block,block=512,samples=16)",
                       "sparse.topk(k=1536,select=block,block=256,samples=16)"}},
      {"lowrank.loki", {"lowrank.loki(topk_frac=0.0625)", "lowrank.loki(topk_frac=0.125)",
                        "lowrank.loki(topk_frac=0.25)"}},
      {"sparse.hyper", {"sparse.hyper(block=64,samples=64,min_seq_len=1024)",
                        "sparse.hyper(block=256,samples=256,min_seq_len=1024)",
                        "sparse.hyper(block=512,samples=512,min_seq_len=1024)"}},
      {"kernel.performer", {"kernel.performer(features=64)", "kernel.performer(features=256)",
                            "kernel.performer(features=1024)"}},
      {"lowrank.nystrom", {"lowrank.nystrom(landmarks=32)", "lowrank.nystrom(landmarks=64)",
                           "lowrank.nystrom(landmarks=256)"}},
  };
  return sweep;
}

Settings preset(bool full) {
  Settings s;
  // lowrank.svd, the low-rank oracle, costs O(N³) per head: N stays where it runs in seconds.
  s.n = full ? "512,2048,4096" : "256,1024";
  s.heads = full ? "8" : "4";
  s.d = "64";
  s.tokens = full ? "512,2048" : "256,1024";
  s.layers = full ? "0,7,15,23,29" : "15";
  s.reps = full ? 5 : 3;
  s.check_rows = full ? 256 : 128;
  s.gemm_size = full ? 2048 : 1024;
  s.ctx = 512;
  s.chunks = full ? 20 : 1;
  s.bd_setups = full ? "mha768,mla512,mha4096" : "mha768";
  s.bd_seeds = full ? 3 : 1;
  s.bd_tokens = full ? 256 : 128;
  s.mla_ranks = full ? "64,128" : "128";
  s.analyze_tokens = 309;  // the survey's §9 experiment
  s.analyze_layers = full ? "all" : "0,15,29";
  // Long context: N doubles from 1k (to the model's context, at most 32k, in a full report).
  s.long_n = full ? "1024,2048,4096,8192" : "1024,2048";
  s.long_ctx = full ? 8192 : 2048;
  // auto(tol=E) times its candidates on every layer's first problem: a full report's work.
  s.long_tol = full ? "0.05" : "";
  return s;
}

struct ReportOptions {
  std::string model = "default", text = "default", out, python = "/usr/bin/python3", plots_script,
              format = "md";
  bool full = false, no_progress = false, no_model = false, no_long = false;
  int threads = 0;
  Settings user;  // empty / 0: the preset's value
  std::vector<std::string> transforms;  // --transform: one ppl row each
};

// One measurement: `numattn ARGS > DIR/OUT` (OUT empty: the command writes its own files).
struct Step {
  Step(std::string id_, std::string section_, std::string title_, std::vector<std::string> args_,
       std::string out_, bool required_ = true, std::string depends_ = "")
      : id(std::move(id_)), section(std::move(section_)), title(std::move(title_)), args(std::move(args_)),
        out(std::move(out_)), required(required_), depends(std::move(depends_)) {}
  std::string id, section, title;
  std::vector<std::string> args;
  std::string out;
  bool required = true;       // a failure fails the report (optional: a row of a table)
  std::string depends;        // id of a step whose output this one reads
  // Filled when run.
  std::string status = "pending", command, stderr_tail;
  int exit_code = 0;
  double seconds = 0, cpu_seconds = 0;
};

// POSIX shell quoting, so that a printed command can be pasted back.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-+=/.,:@%") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    s += shell_quote(a);
  }
  return s;
}

// The last `max_lines` lines of a file (a child's stderr), without the progress lines that a
// carriage return overwrote.
std::string tail_lines(const std::string& path, std::size_t max_lines) {
  // Only the end of the file is read: a child may have written any amount.
  constexpr std::uint64_t kTailBytes = 64 << 10;
  std::string text;
  try {
    const InputFile in(path, "log file", kSizedByHeader);
    const std::uint64_t n = std::min(in.size(), kTailBytes);
    text.resize(static_cast<std::size_t>(n));
    in.read_at(text.data(), text.size(), in.size() - n);
  } catch (const Error& e) {
    return std::string(e.what()) + "\n";
  }
  std::istringstream f(text);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) {
    const std::size_t cr = l.find_last_of('\r');
    if (cr != std::string::npos) l = l.substr(cr + 1);
    if (l.find_first_not_of(" \t") == std::string::npos) continue;
    lines.push_back(l);
  }
  std::string s;
  for (std::size_t i = lines.size() > max_lines ? lines.size() - max_lines : 0; i < lines.size(); ++i)
    s += lines[i] + "\n";
  return s;
}

struct ChildResult {
  int exit_code = 0;    // 128 + signal when killed
  double cpu_s = 0;     // user + system time of the child (and what it waited for)
};

// Runs argv with stdout and stderr to files (stdin from /dev/null) and waits for it.
ChildResult spawn_wait(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  NUMATTN_CHECK(rc == 0, "report: cannot start '{}': {}", argv[0], std::strerror(rc));
  int st = 0;
  struct rusage ru {};
  while (wait4(pid, &st, 0, &ru) < 0) NUMATTN_CHECK(errno == EINTR, "report: wait4: {}", std::strerror(errno));
  ChildResult r;
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  return r;
}

// The executable itself, so children are this very build.
std::string self_exe() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  NUMATTN_CHECK(!ec, "report: cannot resolve /proc/self/exe: {}", ec.message());
  return p.string();
}

// scripts/report_plots.py: the flag, then beside an installed executable (share/numattn), then
// the source tree of a build directory (build/bin/numattn -> scripts/), then the source tree this
// executable was built from.
std::string find_plots_script(const std::string& flag, const std::string& exe) {
  if (!flag.empty()) {
    NUMATTN_CHECK_OPTION(fs::is_regular_file(flag), "plots-script", "'{}' is not a file", flag);
    return flag;
  }
  const fs::path dir = fs::path(exe).parent_path();
  std::vector<fs::path> tried = {dir / "../share/numattn/report_plots.py", dir / "../../scripts/report_plots.py"};
#ifdef NUMATTN_SOURCE_DIR
  tried.push_back(fs::path(NUMATTN_SOURCE_DIR) / "scripts/report_plots.py");
#endif
  std::string list;
  for (const auto& p : tried) {
    if (fs::is_regular_file(p)) return fs::weakly_canonical(p).string();
    list += (list.empty() ? "" : ", ") + p.lexically_normal().string();
  }
  throw Error(fmt::format("report: scripts/report_plots.py not found (looked at {}); pass --plots-script PATH", list));
}

void append(std::vector<std::string>& v, const std::vector<std::string>& more) {
  v.insert(v.end(), more.begin(), more.end());
}

bool contains_word(const std::string& text, const std::string& word) { return text.find(word) != std::string::npos; }

// A probe's output or /proc/loadavg: small text, read through the bounded entry point.
std::string read_text(const std::string& path) {
  return read_file(path, "report input", kJsonInput);
}

class Runner {
 public:
  Runner(std::string exe, fs::path dir, int threads) : exe_(std::move(exe)), dir_(std::move(dir)), threads_(threads) {}

  // Runs a probe (`numattn ARGS`, e.g. `--help`) and returns its stdout ("" if it failed).
  std::string probe(const std::vector<std::string>& args, const std::string& name) {
    std::vector<std::string> argv{exe_};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string out = (dir_ / "logs" / (name + ".stdout")).string();
    const std::string err = (dir_ / "logs" / (name + ".stderr")).string();
    return spawn_wait(argv, out, err).exit_code == 0 ? read_text(out) : std::string();
  }

  // The command line of a step: the executable, its arguments, --threads, and the redirection.
  std::vector<std::string> argv_of(const Step& s) const {
    std::vector<std::string> argv{exe_};
    argv.insert(argv.end(), s.args.begin(), s.args.end());
    // Every measuring subcommand takes --threads (`methods` measures nothing).
    if (threads_ > 0 && s.section != "plots" && s.args.front() != "methods") {
      argv.push_back("--threads");
      argv.push_back(std::to_string(threads_));
    }
    return argv;
  }

  void run(Step& s) {
    const std::vector<std::string> argv = s.section == "plots" ? s.args : argv_of(s);
    s.command = join_command(argv) + (s.out.empty() ? "" : " > " + shell_quote((dir_ / s.out).string()));
    const std::string err = (dir_ / "logs" / (s.id + ".stderr")).string();
    // stdout to a hidden part file, renamed over the output only when the command succeeded.
    const fs::path out = s.out.empty() ? dir_ / "logs" / (s.id + ".stdout") : dir_ / s.out;
    const fs::path part = out.parent_path() / ("." + out.filename().string() + ".part");
    const auto t0 = std::chrono::steady_clock::now();
    const ChildResult cr = spawn_wait(argv, part.string(), err);
    s.exit_code = cr.exit_code;
    s.cpu_seconds = cr.cpu_s;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::error_code ec;
    if (s.exit_code == 0) {
      fs::rename(part, out, ec);
      NUMATTN_CHECK(!ec, "report: cannot rename '{}' to '{}': {}", part.string(), out.string(), ec.message());
      s.status = "ok";
    } else {
      fs::remove(part, ec);
      s.status = "failed";
      s.stderr_tail = tail_lines(err, 12);
    }
  }

  const fs::path& dir() const { return dir_; }

 private:
  std::string exe_;
  fs::path dir_;
  int threads_;
};

// The methods of the catalogue (`numattn methods --format json`), as the steps need them.
struct MethodEntry {
  std::string name, family, caps;
};

std::vector<MethodEntry> parse_methods(const std::string& json_text) {
  std::vector<MethodEntry> out;
  const Row j = Row::parse(json_text, nullptr, false);
  NUMATTN_CHECK(j.is_array(), "report: `numattn methods --format json` did not print a JSON array");
  for (const Row& m : j)
    out.push_back({m.value("name", ""), m.value("family", ""), m.value("capabilities", "")});
  return out;
}

bool has_cap(const MethodEntry& m, const std::string& cap) {
  std::istringstream ss(m.caps);
  for (std::string w; ss >> w;)
    if (w == cap) return true;
  return false;
}

// A step id made from a spec, usable as a file name (data/ppl/ID.json, logs/ID.stderr): the
// characters of a spec's parameter list other than letters, digits, '.', '=' and '-' become '_';
// an id already taken gets a suffix.
std::string file_id(const std::string& raw, std::set<std::string>& taken) {
  std::string id;
  for (char c : raw) {
    if (c == ')' || c == ' ') continue;
    const bool keep =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '=' || c == '-' || c == '_';
    id += keep ? c : '_';
  }
  const std::string base = id;
  for (int k = 2; !taken.insert(id).second; ++k) id = base + "_" + std::to_string(k);
  return id;
}

std::string pick(const std::string& user, const std::string& preset) { return user.empty() ? preset : user; }
template <class T>
T pick(T user, T preset) {
  return user > 0 ? user : preset;
}

}  // namespace

void add_report(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  auto* sub = app.add_subcommand(
      "report",
      "the main job: error against time and memory of every registered method (random and "
      "captured inputs), perplexity and KL per causal method, BDA (and MLA, analyze) tables, as "
      "plots, report.md and index.html in --out; each measurement is a numattn command run as a "
      "child process and printed in the report");
  sub->add_option("--model", o->model, "GGUF file, or 'default'")->capture_default_str();
  sub->add_option("--text", o->text, "UTF-8 text file, or 'default' (Jane Austen)")->capture_default_str();
  sub->add_option("--out", o->out, "report directory (created; data/, logs/, plots/ inside)")->required();
  sub->add_flag("--full", o->full,
                "the thorough report (more sizes, layers, chunks and repetitions; tens of minutes) "
                "instead of the quick default (a few minutes on two cores)");
  sub->add_flag("--no-model", o->no_model,
                "random inputs only: no capture, perplexity, BDA-on-model, MLA or analyze steps");
  Settings& u = o->user;
  sub->add_option("--n", u.n, "sequence lengths of the random-input benchmarks (list; quick 256,1024, full 512,2048,4096)");
  sub->add_option("--heads", u.heads, "heads of the random-input benchmarks (quick 4, full 8)");
  sub->add_option("--d", u.d, "head dimension of the random-input benchmarks (64)");
  sub->add_option("--tokens", u.tokens, "token counts of the captured Q/K/V (list; one capture each; quick 256,1024, full 512,2048)");
  sub->add_option("--layers", u.layers, "captured layers benchmarked (list; default from the model's L layers: quick L/2 (a global layer near it when the model has sliding-window layers), full 0,L/4,L/2,3L/4,L-1)");
  sub->add_option("--bench-methods", u.bench_methods,
                  "methods benchmarked (comma-separated specs; default: every registered method)");
  sub->add_option("--reps", u.reps, "timed repetitions per benchmark row (quick 3, full 5)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--check-rows", u.check_rows, "rows checked against float64 per row (quick 128, full 256)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--gemm-size", u.gemm_size, "size of the benchmarks' sgemm baseline (quick 1024, full 2048)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--ctx", u.ctx, "perplexity context (512)")
      ->check(CLI::Range(4, 1 << 20));
  sub->add_option("--chunks", u.chunks, "perplexity chunks per method (quick 1, full 20)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--ppl-methods", u.ppl_methods,
                  "methods of the perplexity table (comma-separated; default: every causal method "
                  "but exact.reference and dist.*)");
  sub->add_option("--bd-setups", u.bd_setups, "bd-study set-ups (quick mha768, full all three)");
  sub->add_option("--bd-seeds", u.bd_seeds, "bd-study seeds (quick 1, full 3)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--bd-tokens", u.bd_tokens, "bd-study tokens (quick 128, full 256)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--mla-ranks", u.mla_ranks,
                  "latent ranks of the MLA table (list; each a `ppl --transform \"mla(rank=R)\"` row)");
  sub->add_option("--transform", o->transforms,
                  "a model transform pipeline (`numattn transforms`, e.g. \"mla(rank=128)|bda(pairs=qk)\"): "
                  "one perplexity and KL row of the model-transforms table (repeatable)");
  sub->add_option("--analyze-tokens", u.analyze_tokens, "tokens of `numattn analyze` (309, the survey's §9)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--analyze-layers", u.analyze_layers, "layers of `numattn analyze` (quick 0, the captured layer, L-1; full all)");
  sub->add_option("--long-n", u.long_n,
                  "sequence lengths of the long-context section (list; quick 1024,2048, full 1024 "
                  "doubling to the model's context, at most 32768)");
  sub->add_option("--long-ctx", u.long_ctx,
                  "perplexity context of the long-context section (quick 2048, full 8192; at most the model's)")
      ->check(CLI::Range(4, 1 << 20));
  sub->add_option("--long-methods", u.long_methods,
                  "configurations of the long-context section (comma-separated specs; default: each "
                  "family's budget swept)");
  sub->add_option("--long-tol", u.long_tol,
                  "error targets of auto(tol=E) in the model in the long-context section, with its "
                  "per-layer choice (list; quick none, full 0.05)");
  sub->add_flag("--no-long", o->no_long, "leave out the long-context section");
  sub->add_option("--python", o->python, "Python with matplotlib that draws the plots")->capture_default_str();
  sub->add_option("--plots-script", o->plots_script,
                  "report_plots.py to use (default: found beside the executable or in its source tree)");
  sub->add_flag("--no-progress", o->no_progress, "no progress bar on stderr (the line per step stays)");
  add_common(*sub, &o->threads, &o->format);
  sub->callback([o] {
    const auto t_start = std::chrono::steady_clock::now();
    const Settings p = preset(o->full);
    const Settings& u = o->user;
    Settings s;
    s.n = pick(u.n, p.n);
    s.heads = pick(u.heads, p.heads);
    s.d = pick(u.d, p.d);
    s.tokens = pick(u.tokens, p.tokens);
    s.layers = pick(u.layers, p.layers);
    s.bench_methods = u.bench_methods;
    s.reps = pick(u.reps, p.reps);
    s.check_rows = pick(u.check_rows, p.check_rows);
    s.gemm_size = pick(u.gemm_size, p.gemm_size);
    s.ctx = pick(u.ctx, p.ctx);
    s.chunks = pick(u.chunks, p.chunks);
    s.ppl_methods = u.ppl_methods;
    s.bd_setups = pick(u.bd_setups, p.bd_setups);
    s.bd_seeds = pick(u.bd_seeds, p.bd_seeds);
    s.bd_tokens = pick(u.bd_tokens, p.bd_tokens);
    s.mla_ranks = pick(u.mla_ranks, p.mla_ranks);
    s.analyze_tokens = pick(u.analyze_tokens, p.analyze_tokens);
    s.analyze_layers = pick(u.analyze_layers, p.analyze_layers);
    s.long_n = pick(u.long_n, p.long_n);
    s.long_ctx = pick(u.long_ctx, p.long_ctx);
    s.long_methods = u.long_methods;
    s.long_tol = pick(u.long_tol, p.long_tol);
    ExecContext ctx{o->threads};  // checks --threads
    (void)ctx.num_threads();

    // Everything that can be refused is refused before the first measurement. The method
    // lists first: each spec whole (commas inside its parentheses are its own) and
    // known to the registry, or the report stops here instead of measuring with a mangled list.
    auto specs_of = [](const std::string& option, const std::string& list) {
      std::vector<std::string> specs = split_spec_option(option, list);
      for (const std::string& sp : specs) {
        try {
          (void)create_method(sp);
        } catch (const Error& e) {
          throw OptionError(option, e.what());
        }
      }
      return specs;
    };
    const std::vector<std::string> bench_specs = s.bench_methods.empty()
                                                     ? std::vector<std::string>{}
                                                     : specs_of("bench-methods", s.bench_methods);
    const std::vector<std::string> user_long_specs = s.long_methods.empty() || o->no_long
                                                         ? std::vector<std::string>{}
                                                         : specs_of("long-methods", s.long_methods);
    for (const std::string& t : split_list(s.long_tol)) {
      double v = 0;
      try {
        std::size_t used = 0;
        v = std::stod(t, &used);
        if (used != t.size()) v = -1;
      } catch (const std::exception&) {
        v = -1;
      }
      if (!(v > 0 && v < 1)) throw OptionError("long-tol", fmt::format("'{}' is not an error target in (0, 1)", t));
    }
    const std::vector<std::string> user_ppl_specs = s.ppl_methods.empty() || o->no_model
                                                        ? std::vector<std::string>{}
                                                        : specs_of("ppl-methods", s.ppl_methods);
    // Checked before anything runs, by the parser every front-end uses.
    for (const std::string& t : o->transforms) {
      NUMATTN_CHECK_OPTION(!o->no_model, "transform", "needs the model (not with --no-model)");
      try {
        transform::parse_transforms(t);
      } catch (const Error& e) {
        throw OptionError("transform", e.what());
      }
    }
    const std::string exe = self_exe();
    const std::string script = find_plots_script(o->plots_script, exe);
    check_output_option("--out", o->out, OutputKind::kDirectory);
    std::error_code ec;
    const fs::path dir(o->out);
    for (const char* sd : {"data", "logs", "plots"}) {
      fs::create_directories(dir / sd, ec);
      NUMATTN_CHECK(!ec, "--out: cannot create '{}': {}", (dir / sd).string(), ec.message());
    }
    std::string model_path, text_path;
    if (!o->no_model) {
      model_path = resolve_model_path(o->model);
      text_path = resolve_text_path(o->text);
    }
    // The model's attention problem, from the GGUF header: a perplexity method whose own can_run
    // refuses it is expected to be refused by ppl (an optional row with the reason); any other
    // failed perplexity run fails the report.
    std::optional<ModelHParams> hp;
    std::int64_t long_layer = 0;
    if (!o->no_model) {
      hp = LlamaModel::read_hparams(GgufFile::open(model_path));
      // Default layers from the model's depth L: captured L/2 (quick; the global layer nearest
      // it in a model with sliding-window layers) or 0, L/4, L/2, 3L/4, L − 1 (full); analyzed
      // 0, L/2, L − 1 (quick) or all.
      const std::int64_t L = hp->n_layer;
      std::int64_t mid = L / 2;
      if (!hp->local_layers.empty() && hp->is_local(mid))
        for (std::int64_t d = 1; d < L; ++d) {
          if (mid + d < L && !hp->is_local(mid + d)) { mid += d; break; }
          if (mid - d >= 0 && !hp->is_local(mid - d)) { mid -= d; break; }
        }
      auto list = [](std::vector<std::int64_t> v) {
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
        return fmt::format("{}", fmt::join(v, ","));
      };
      if (u.layers.empty())
        s.layers = o->full ? list({0, L / 4, L / 2, (3 * L) / 4, L - 1}) : std::to_string(mid);
      if (u.analyze_layers.empty() && !o->full) s.analyze_layers = list({0, mid, L - 1});
      // Long context: one layer (the mid global one), lengths within the trained context.
      long_layer = mid;
      const std::int64_t n_train = hp->n_ctx_train > 0 ? hp->n_ctx_train : std::int64_t{1} << 15;
      if (u.long_n.empty() && o->full) {
        std::vector<std::int64_t> ns;
        for (std::int64_t n = 1024; n <= std::min<std::int64_t>(n_train, 32768); n *= 2) ns.push_back(n);
        s.long_n = list(ns);
      }
      std::vector<std::int64_t> long_ns;
      for (const std::string& t : split_list(s.long_n)) {
        const long long n = std::atoll(t.c_str());
        if (n < 2 || std::to_string(n) != t)
          throw OptionError("long-n", fmt::format("'{}' is not a sequence length", t));
        if (!u.long_n.empty() && n > n_train)
          throw OptionError("long-n", fmt::format("{} is beyond the model's context of {} tokens", n, n_train));
        if (n <= n_train) long_ns.push_back(n);  // a preset's lengths stop at the model's context
      }
      s.long_n = list(long_ns);
      if (u.long_ctx == 0) s.long_ctx = std::min(s.long_ctx, n_train);
      NUMATTN_CHECK(s.long_ctx <= n_train, "--long-ctx: {} is beyond the model's context of {} tokens", s.long_ctx,
                    n_train);
    }
    auto runs_on_model = [&](const std::string& spec) {
      try {
        check_model_attention("ppl-methods", spec, *hp, s.ctx, s.ctx, "chunk's");
        return true;
      } catch (const OptionError&) {
        return false;
      }
    };
    {
      // Plots need matplotlib; a missing one is found now, not after the measurements.
      const std::string err = (dir / "logs" / "python_check.stderr").string();
      const int rc = spawn_wait({o->python, "-c", "import matplotlib, matplotlib.pyplot"},
                                (dir / "logs" / "python_check.stdout").string(), err).exit_code;
      NUMATTN_CHECK(rc == 0,
                    "report: '{}' cannot import matplotlib (install Debian's python3-matplotlib, "
                    "e.g. with scripts/setup.sh, or pass --python): {}",
                    o->python, tail_lines(err, 3));
    }

    Runner runner(exe, dir, o->threads);
    // What this executable can do, asked of itself (other branches add subcommands and flags).
    const std::string help = runner.probe({"--help"}, "probe_help");
    const bool has_analyze = contains_word(help, "\n  analyze ");
    const std::string ppl_help = runner.probe({"ppl", "--help"}, "probe_ppl_help");
    const bool has_transform = contains_word(ppl_help, "--transform");
    const bool has_mla = has_transform || contains_word(ppl_help, "--mla-rank");
    const std::vector<MethodEntry> methods = parse_methods(runner.probe({"methods", "--format", "json"}, "probe_methods"));

    std::vector<Step> steps;
    auto add = [&](Step st) { steps.push_back(std::move(st)); };
    const std::string reps = std::to_string(s.reps), check = std::to_string(s.check_rows),
                      gemm = std::to_string(s.gemm_size), chunks = std::to_string(s.chunks),
                      ctxs = std::to_string(s.ctx);
    add({"methods", "methods", "the registered methods", {"methods", "--format", "json"}, "data/methods.json"});
    std::vector<std::string> bench_sel;
    if (s.bench_methods.empty()) {
      bench_sel = {"--all"};
    } else {
      for (const auto& m : bench_specs) {
        bench_sel.push_back("--method");
        bench_sel.push_back(m);
      }
    }
    for (const char* dist : {"gaussian", "spiky"}) {
      std::vector<std::string> a{"bench"};
      a.insert(a.end(), bench_sel.begin(), bench_sel.end());
      append(a, {"--n", s.n, "--heads", s.heads, "--d", s.d, "--dist", dist, "--reps", reps, "--check-rows",
                 check, "--gemm-size", gemm, "--format", "json"});
      add({std::string("bench_") + dist, "pareto", std::string("error, time and memory: ") + dist + " inputs", a,
           std::string("data/bench_") + dist + ".json"});
    }
    if (!o->no_model) {
      for (const std::string& tok : split_list(s.tokens)) {
        const std::string qdir = (dir / "data" / ("qkv_n" + tok)).string();
        add({"capture_n" + tok, "capture", "capture Q/K/V of layers " + s.layers + " at N = " + tok,
             {"capture", "--model", model_path, "--text", text_path, "--tokens", tok, "--layers", s.layers,
              "--out", qdir, "--no-progress", "--format", "json"},
             "data/capture_n" + tok + ".json"});
        std::vector<std::string> a{"bench"};
        a.insert(a.end(), bench_sel.begin(), bench_sel.end());
        append(a, {"--qkv", qdir, "--layer", s.layers, "--causal", "bottom-right", "--reps", reps,
                   "--check-rows", check, "--gemm-size", gemm, "--format", "json"});
        add({"bench_captured_n" + tok, "pareto", "error, time and memory: captured Q/K/V, N = " + tok, a,
             "data/bench_captured_n" + tok + ".json", true, "capture_n" + tok});
      }
      const std::vector<std::string> model_args{"--model", model_path, "--text", text_path, "--ctx", ctxs,
                                                "--chunks", chunks, "--no-progress", "--format", "json"};
      auto ppl_step = [&](const std::string& id, const std::string& section, const std::string& title,
                          std::vector<std::string> extra, bool required) {
        std::vector<std::string> a{"ppl"};
        a.insert(a.end(), model_args.begin(), model_args.end());
        a.insert(a.end(), extra.begin(), extra.end());
        add({id, section, title, a, "data/" + section + "/" + id + ".json", required});
      };
      fs::create_directories(dir / "data" / "ppl", ec);
      fs::create_directories(dir / "data" / "bda", ec);
      ppl_step("ppl_exact.flash", "ppl", "perplexity: exact.flash (the baseline)", {"--attn", "exact.flash"}, true);
      std::vector<std::string> ppl_methods;
      if (s.ppl_methods.empty()) {
        for (const auto& m : methods)
          if (has_cap(m, "causal") && m.name != "exact.flash" && m.name != "exact.reference" && m.family != "dist")
            ppl_methods.push_back(m.name);
      } else {
        ppl_methods = user_ppl_specs;
      }
      // A method that cannot run the model's problem (e.g. no GQA) is refused by ppl before
      // the weights load: its row says so, the report goes on. A method that can run it must.
      // A model with sliding-window layers (Gemma 3) keeps them: their attention is already a
      // sparse method, so each method replaces the global layers (`global:SPEC`).
      const bool hybrid = hp && std::any_of(hp->local_layers.begin(), hp->local_layers.end(),
                                            [](std::uint8_t f) { return f != 0; });
      std::set<std::string> ppl_ids{"ppl_exact.flash"};
      for (const auto& m : ppl_methods) {
        const std::string spec = hybrid && m.find(':') == std::string::npos ? "global:" + m : m;
        ppl_step(file_id("ppl_" + m, ppl_ids), "ppl",
                 "perplexity and KL: " + m + (spec != m ? " (global layers; local layers keep their window)" : ""),
                 {"--attn", spec, "--baseline", "exact.flash"}, runs_on_model(spec));
      }
      // Model transforms as pipeline strings (an executable from before --transform: its flags).
      ppl_step("bda_ppl_vo", "bda", "BD Attention (VO) on the model",
               has_transform ? std::vector<std::string>{"--transform", "bda(pairs=vo)"}
                             : std::vector<std::string>{"--bda", "vo"},
               true);
      if (has_mla && hp && hp->attention_extras().empty()) {
        fs::create_directories(dir / "data" / "mla", ec);
        for (const auto& r : split_list(s.mla_ranks))
          ppl_step("mla_rank" + r, "mla", "MLA at latent rank " + r,
                   has_transform ? std::vector<std::string>{"--transform", "mla(rank=" + r + ")"}
                                 : std::vector<std::string>{"--mla-rank", r},
                   false);
      }
      if (!o->transforms.empty()) {
        fs::create_directories(dir / "data" / "transform", ec);
        for (std::size_t i = 0; i < o->transforms.size(); ++i)
          ppl_step("transform_" + std::to_string(i + 1), "transform", "model transforms " + o->transforms[i],
                   {"--transform", o->transforms[i]}, false);
      }
      if (!o->no_long) {
        // Long context: the swept configurations against exact.flash on the model's own Q/K/V
        // at each length, then in the model at long_ctx (PPL/KL against tokens/s) and the
        // per-layer choice of auto(tol=E).
        fs::create_directories(dir / "data" / "long", ec);
        std::vector<std::string> long_specs = user_long_specs, long_ppl_specs = user_long_specs;
        if (long_specs.empty())
          for (const LongFamily& f : long_sweep()) {
            long_specs.insert(long_specs.end(), f.specs.begin(), f.specs.end());
            if (o->full)
              long_ppl_specs.insert(long_ppl_specs.end(), f.specs.begin(), f.specs.end());
            else
              long_ppl_specs.push_back(f.specs[f.specs.size() / 2]);
          }
        const std::string ll = std::to_string(long_layer);
        for (const std::string& nn : split_list(s.long_n)) {
          const std::string qdir = (dir / "data" / "long" / ("qkv_n" + nn)).string();
          add({"long_capture_n" + nn, "long", "capture Q/K/V of layer " + ll + " at N = " + nn,
               {"capture", "--model", model_path, "--text", text_path, "--tokens", nn, "--layers", ll, "--out", qdir,
                "--no-progress", "--format", "json"},
               "data/long/capture_n" + nn + ".json"});
          std::vector<std::string> a{"bench", "--method", "exact.flash"};
          for (const std::string& sp : long_specs) append(a, {"--method", sp});
          append(a, {"--qkv", qdir, "--layer", ll, "--causal", "bottom-right", "--reps", reps, "--check-rows", check,
                     "--gemm-size", gemm, "--format", "json"});
          add({"long_bench_n" + nn, "long", "long context: captured Q/K/V of layer " + ll + ", N = " + nn, a,
               "data/long/bench_n" + nn + ".json", true, "long_capture_n" + nn});
        }
        const std::string lctx = std::to_string(s.long_ctx);
        const std::vector<std::string> long_model{"--model", model_path, "--text", text_path, "--ctx", lctx,
                                                  "--chunks", "1", "--no-progress", "--format", "json"};
        const bool hybrid_long = std::any_of(hp->local_layers.begin(), hp->local_layers.end(),
                                             [](std::uint8_t f) { return f != 0; });
        auto long_ppl = [&](const std::string& id, const std::string& title, const std::string& spec, bool base) {
          std::vector<std::string> a{"ppl"};
          a.insert(a.end(), long_model.begin(), long_model.end());
          append(a, {"--attn", spec});
          if (base) append(a, {"--baseline", "exact.flash"});
          bool ok = true;
          try {
            check_model_attention("long-methods", spec, *hp, s.long_ctx, s.long_ctx, "chunk's");
          } catch (const OptionError&) {
            ok = false;
          }
          add({id, "long", title, a, "data/long/" + id + ".json", ok});
        };
        std::set<std::string> long_ids;
        long_ppl(file_id("long_ppl_exact.flash", long_ids), "long context in the model: exact.flash, ctx " + lctx,
                 "exact.flash", false);
        for (const std::string& m : long_ppl_specs) {
          const std::string spec = hybrid_long && m.find(':') == std::string::npos ? "global:" + m : m;
          long_ppl(file_id("long_ppl_" + m, long_ids), "long context in the model: " + m + ", ctx " + lctx, spec, true);
        }
        for (const std::string& t : split_list(s.long_tol)) {
          // One timed run per candidate: the choice is made once per layer, and its cost is the step's.
          const std::string spec = "auto(tol=" + t + ",reps=1)";
          long_ppl(file_id("long_auto_tol" + t, long_ids), "long context in the model: per-layer " + spec + ", ctx " + lctx,
                   hybrid_long ? "global:" + spec : spec, true);
        }
      }
      if (has_analyze) {
        add({"analyze", "analyze", "spectra, sparsity and the §9 findings (numattn analyze)",
             {"analyze", "--model", model_path, "--text", text_path, "--tokens", std::to_string(s.analyze_tokens),
              "--layers", s.analyze_layers, "--out", (dir / "data" / "analyze").string(), "--predict",
              "--no-progress"},
             ""});
      }
    }
    add({"bd_study", "bda", "BDA basis rules on random weights (bd-study)",
         {"bd-study", "--setups", s.bd_setups, "--seeds", std::to_string(s.bd_seeds), "--tokens",
          std::to_string(s.bd_tokens), "--format", "json"},
         "data/bda/bd_study.json"});
    fs::create_directories(dir / "data" / "bda", ec);
    Step plots{"plots", "plots", "plots, report.md and index.html",
               {o->python, script, "--dir", dir.string()}, ""};
    const std::size_t n_meas = steps.size();

    // The record of the run: what report_plots.py reads besides the data files.
    auto write_steps = [&](const std::vector<Step>& all) {
      Row meta;
      meta["format"] = "numattn-report";
      meta["version"] = 1;
      meta["executable"] = exe;
      meta["mode"] = o->full ? "full" : "quick";
      meta["model"] = o->no_model ? Row() : Row(model_path);
      meta["text"] = o->no_model ? Row() : Row(text_path);
      meta["threads"] = ExecContext{o->threads}.num_threads();
      meta["hardware_threads"] = hardware_threads();
      meta["loadavg"] = read_text("/proc/loadavg");
      meta["has_analyze"] = has_analyze;
      meta["has_mla"] = has_mla && (!hp || hp->attention_extras().empty());
      meta["settings"] = {{"n", s.n}, {"heads", s.heads}, {"d", s.d}, {"tokens", s.tokens},
                          {"layers", s.layers}, {"reps", s.reps}, {"check_rows", s.check_rows},
                          {"ctx", s.ctx}, {"chunks", s.chunks}, {"bd_setups", s.bd_setups},
                          {"analyze_tokens", s.analyze_tokens}, {"analyze_layers", s.analyze_layers},
                          {"long_n", s.long_n}, {"long_ctx", s.long_ctx}, {"long_tol", s.long_tol},
                          {"long_layer", long_layer}};
      Row arr = Row::array();
      for (const Step& st : all) {
        Row r;
        r["id"] = st.id;
        r["section"] = st.section;
        r["title"] = st.title;
        r["command"] = st.command.empty() ? join_command(st.section == "plots" ? st.args : runner.argv_of(st)) : st.command;
        r["output"] = st.out.empty() ? Row() : Row(st.out);
        r["status"] = st.status;
        r["required"] = st.required;
        r["exit_code"] = st.exit_code;
        r["seconds"] = st.seconds;
        r["cpu_seconds"] = st.cpu_seconds;
        r["stderr"] = st.stderr_tail;
        arr.push_back(r);
      }
      meta["steps"] = arr;
      const std::string text = dump_json(meta, 2) + "\n";
      write_file_atomically((dir / "data" / "steps.json").string(), text.data(), text.size(), "steps.json");
    };

    ProgressBar bar("report", static_cast<std::int64_t>(n_meas + 1),
                    o->no_progress ? ProgressBar::Mode::kOff : ProgressBar::Mode::kAuto, 0.0);
    std::set<std::string> failed_ids;
    std::size_t idx = 0;
    auto line = [&](const Step& st) {
      std::string l = fmt::format("report: [{}/{}] {}: {} ({:.1f} s, cpu {:.1f} s)", idx, n_meas + 1,
                                  st.title, st.status, st.seconds, st.cpu_seconds);
      if (bar.enabled()) std::fprintf(stderr, "\r\033[K");
      std::fprintf(stderr, "%s\n", l.c_str());
      if (st.status == "failed")
        std::fprintf(stderr, "report:   command: %s\nreport:   exit %d; stderr:\n%s", st.command.c_str(),
                     st.exit_code, st.stderr_tail.c_str());
      std::fflush(stderr);
    };
    for (std::size_t i = 0; i < n_meas; ++i) {
      Step& st = steps[i];
      idx = i + 1;
      bar.set(static_cast<std::int64_t>(i), st.title);
      if (!st.depends.empty() && failed_ids.count(st.depends)) {
        st.status = "skipped: " + st.depends + " failed";
        st.command = join_command(runner.argv_of(st)) + " > " + shell_quote((dir / st.out).string());
      } else {
        runner.run(st);
      }
      if (st.status != "ok") failed_ids.insert(st.id);
      line(st);
      write_steps(steps);
    }
    idx = n_meas + 1;
    bar.set(static_cast<std::int64_t>(n_meas), plots.title);
    // The plots step sees every measurement's status in steps.json; its own is added after.
    runner.run(plots);
    if (plots.status == "ok" && !fs::is_regular_file(dir / "index.html")) {
      plots.status = "failed";
      plots.stderr_tail = fmt::format("{} exited 0 without writing {}\n", script, (dir / "index.html").string());
    }
    line(plots);
    bar.set(static_cast<std::int64_t>(n_meas + 1));
    bar.finish();
    steps.push_back(plots);
    write_steps(steps);

    std::vector<Row> rows;
    int hard_failures = 0, soft_failures = 0;
    for (const Step& st : steps) {
      Row r;
      r["step"] = st.id;
      r["status"] = st.status;
      r["seconds"] = st.seconds;
      r["cpu_seconds"] = st.cpu_seconds;
      r["output"] = st.out.empty() ? Row() : Row(st.out);
      rows.push_back(r);
      if (st.status != "ok") (st.required ? hard_failures : soft_failures)++;
    }
    print_table(std::cout, rows, parse_format(o->format));
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    double cpu = 0;
    for (const Step& st : steps) cpu += st.cpu_seconds;
    std::fprintf(stderr, "report: %zu steps in %.0f s, %.0f s of CPU (%d failed, %d optional failed)\n",
                 steps.size(), total, cpu, hard_failures, soft_failures);
    if (plots.status == "ok")
      std::fprintf(stderr, "report: %s\n", (dir / "index.html").string().c_str());
    NUMATTN_CHECK(hard_failures == 0, "report: {} step(s) failed (their commands and stderr are above and in {})",
                  hard_failures, (dir / "data" / "steps.json").string());
  });
}

NUMATTN_COMMAND(78, add_report);

}  // namespace numattn::cli

#include "qkv_source.h"

#include <algorithm>
#include <filesystem>

#include <fmt/ranges.h>

#include "numattn/core/file_io.h"
#include "numattn/core/npy.h"

namespace numattn::cli {

std::string qkv_file_name(std::int64_t layer, const std::string& t) {
  return "layer" + std::to_string(layer) + "_" + t + ".npy";
}

std::string CapturedLayer::source() const { return "capture " + dir + " layer " + std::to_string(layer); }

namespace {

std::int64_t positive_int(const Row& m, const std::string& key, const std::string& mpath) {
  NUMATTN_CHECK(m.contains(key) && m[key].is_number_integer() && m[key].get<std::int64_t>() >= 1,
                "{}: '{}' must be an integer >= 1", mpath, key);
  return m[key].get<std::int64_t>();
}

}  // namespace

CapturedLayer read_capture(const std::string& dir, std::int64_t layer) {
  namespace fs = std::filesystem;
  std::error_code ec;
  NUMATTN_CHECK(fs::is_directory(dir, ec), "--qkv: '{}' is not a directory (a `numattn capture --out` directory)", dir);
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  const std::string text = read_file(mpath, "--qkv manifest", kJsonInput);
  CapturedLayer c;
  c.dir = dir;
  c.layer = layer;
  try {
    c.manifest = Row::parse(text);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", mpath, e.what()));
  }
  const Row& m = c.manifest;
  NUMATTN_CHECK(m.is_object() && m.value("format", std::string()) == "numattn-qkv-capture",
                "{}: not a numattn capture manifest (\"format\": \"numattn-qkv-capture\" missing)", mpath);
  // A later layout of the files would be misread silently as this one.
  NUMATTN_CHECK(m.contains("version") && m["version"].is_number_integer() && m["version"].get<std::int64_t>() == 1,
                "{}: capture manifest version {} is not one this numattn reads (1)", mpath,
                m.contains("version") ? m["version"].dump() : std::string("(missing)"));
  NUMATTN_CHECK(m.contains("layers") && m["layers"].is_array(), "{}: 'layers' must be an array", mpath);
  std::vector<std::int64_t> layers;
  for (const auto& x : m["layers"]) {
    NUMATTN_CHECK(x.is_number_integer(), "{}: 'layers' must hold integers", mpath);
    layers.push_back(x.get<std::int64_t>());
  }
  if (std::find(layers.begin(), layers.end(), layer) == layers.end()) {
    std::string have;
    for (auto l : layers) have += (have.empty() ? "" : ", ") + std::to_string(l);
    throw OptionError("layer", fmt::format("layer {} is not in the capture {} (it holds layers {})",
                                           layer, dir, have));
  }
  c.heads = positive_int(m, "heads", mpath);
  c.kv_heads = positive_int(m, "kv_heads", mpath);
  c.n = positive_int(m, "tokens", mpath);
  c.d = positive_int(m, "head_dim", mpath);
  NUMATTN_CHECK(c.heads % c.kv_heads == 0,
                "{}: heads ({}) must be a multiple of kv_heads ({}) (the GQA ratio)", mpath, c.heads,
                c.kv_heads);
  const std::string key = std::to_string(layer);
  NUMATTN_CHECK(m.contains("files") && m["files"].is_object() && m["files"].contains(key) &&
                    m["files"][key].is_object(),
                "{}: 'files' has no entry for layer {}", mpath, layer);
  auto load = [&](const char* t, index_t H, std::vector<float>& buf, std::string& path) {
    const Row& f = m["files"][key];
    NUMATTN_CHECK(f.contains(t) && f[t].is_string(), "{}: files.{}.{} must be a file name", mpath, key, t);
    const std::string name = f[t].get<std::string>();
    // A file of the capture itself: a plain name inside the directory, never a path out of it.
    NUMATTN_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                  "{}: files.{}.{} = '{}' must be a file name inside the directory", mpath, key, t, name);
    path = (fs::path(dir) / name).string();
    npy::Array a = npy::read(path);
    const std::vector<std::int64_t> want{H, c.n, c.d};
    NUMATTN_CHECK(a.shape == want,
                  "{}: shape [{}] does not match the manifest: expected [{}, {}, {}] ([{}, tokens, "
                  "head_dim])",
                  path, fmt::join(a.shape, ", "), H, c.n, c.d, t[0] == 'q' ? "heads" : "kv_heads");
    buf = a.as_f32();
  };
  load("q", c.heads, c.q, c.q_path);
  load("k", c.kv_heads, c.k, c.k_path);
  load("v", c.kv_heads, c.v, c.v_path);
  return c;
}

FileProblem::FileProblem(const std::vector<float>& q, std::array<index_t, 4> qs,
                         const std::vector<float>& k, std::array<index_t, 4> ks,
                         const std::vector<float>& v, std::array<index_t, 4> vs,
                         const ProblemConfig& cfg)
    : cfg_(cfg) {
  auto view = [&](std::vector<float>& buf, std::array<index_t, 4> s) {
    return cfg.layout == Layout::kBHND ? TensorView<float>::contiguous(buf.data(), s)
                                       : TensorView<float>::bnhd(buf.data(), s[0], s[1], s[2], s[3]);
  };
  auto fill = [&](const std::vector<float>& src, std::array<index_t, 4> s, std::vector<float>& dst,
                  double mul) {
    dst.resize(src.size());
    TensorView<float> d = view(dst, s);
    std::size_t at = 0;
    for (index_t b = 0; b < s[0]; ++b)
      for (index_t h = 0; h < s[1]; ++h)
        for (index_t i = 0; i < s[2]; ++i)
          for (index_t x = 0; x < s[3]; ++x)
            d(b, h, i, x) = mul == 1.0 ? src[at++] : static_cast<float>(src[at++] * mul);
    return TensorView<const float>(d);
  };
  p_.q = fill(q, qs, q_, cfg.logit_scale);
  p_.k = fill(k, ks, k_, 1.0);
  p_.v = fill(v, vs, v_, 1.0);
  const std::array<index_t, 4> os{qs[0], qs[1], qs[2], vs[3]};
  out_.assign(static_cast<std::size_t>(os[0] * os[1] * os[2] * os[3]), 0.f);
  p_.out = view(out_, os);
  p_.scale = cfg.scale;
  p_.causal = cfg.causal;
  p_.window_left = cfg.window_left;
  p_.window_right = cfg.window_right;
  set_lse(cfg.want_lse);
  validate(p_);
}

void FileProblem::set_lse(bool on) {
  if (!on) {
    p_.lse = {};
    return;
  }
  const auto& s = p_.q.shape;
  lse_.assign(static_cast<std::size_t>(s[0] * s[1] * s[2]), 0.f);
  p_.lse = TensorView<float>::contiguous(lse_.data(), {s[0], s[1], s[2], 1});
}

}  // namespace numattn::cli

// The transform registry and pipeline strings (transform/pipeline.h): the parser round trip
// (spec → canonical → the same spec), the typed stages, the older --tensor grammar mapped onto
// tensor.* stages, and the refusals of bad input with messages that name the problem.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "numattn/core/error.h"
#include "numattn/transform/pipeline.h"

namespace numattn {
namespace {
namespace NUMATTN_UNITY_ID {

using transform::parse_transforms;

std::string error_of(const std::string& p) {
  try {
    parse_transforms(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TransformPipeline, EmptyIsNoTransform) {
  EXPECT_TRUE(parse_transforms("").empty());
  EXPECT_TRUE(parse_transforms("  ").empty());
  EXPECT_EQ(parse_transforms("").canonical(), "");
}

TEST(TransformPipeline, CanonicalFillsDefaultsAndRoundTrips) {
  const auto p = parse_transforms(" mla( rank = 128 , rope_heads=1 ) | bda(pairs=qk) ");
  EXPECT_EQ(p.canonical(),
            "mla(rank=128,rope_heads=1,rope_dims=0,freqfold=1,balance=0,budget=0,calib=default,calib_tokens=2048,"
            "calib_mode=two_pass,exec=absorbed,weights=f32)|"
            "bda(pairs=qk,coef=q8_0)");
  ASSERT_TRUE(p.mla && p.bda);
  EXPECT_FALSE(p.tensor);
  EXPECT_EQ(p.mla->options.rank, 128);
  EXPECT_EQ(p.mla->options.rope_heads, 1);
  EXPECT_EQ(p.mla->calib_tokens, 2048);
  EXPECT_EQ(p.mla->exec, "absorbed");
  EXPECT_EQ(p.bda->pairs, "qk");
  EXPECT_EQ(p.bda->coef, "q8_0");
  // Every registered transform, with its required parameters, round-trips.
  for (const std::string& s : std::vector<std::string>{
           "mla(rank=0,freqfold=2,calib=/tmp/x.txt,calib_tokens=512,exec=naive)",
           "bda(pairs=qkvo,coef=f32)", "tensor.vo_cp(rank=256,iters=8,seed=7,exec=factored)",
           "tensor.qk_cp(rank=0)", "tensor.tucker_qkvo(rank=128,rank2=256,layers=8)",
           "tensor.tucker_ffn(rank=384)", "tensor.tucker_heads(rank=64,rank2=32,heads=3,iters=4)",
           "mla(rank=64)|tensor.qk_cp(rank=32)", "mla(rank=64)|bda(pairs=vo)", "mla(budget=0.5)",
           "mla(rank=96,rope_dims=32,freqfold=4,calib_mode=one_pass)"}) {
    const auto a = parse_transforms(s);
    const auto b = parse_transforms(a.canonical());
    EXPECT_EQ(a.canonical(), b.canonical()) << s;
    ASSERT_EQ(a.stages.size(), b.stages.size()) << s;
    if (a.tensor) EXPECT_EQ(a.tensor->canonical(), b.tensor->canonical()) << s;
  }
  EXPECT_EQ(parse_transforms("mla(rank=0,calib=/tmp/x.txt)").mla->calib, "/tmp/x.txt");
}

TEST(TransformPipeline, TensorStagesAreTheOlderGrammar) {
  // Each spec of the --tensor grammar gives the same TensorSpec as its tensor.* stage.
  for (const std::string& old : std::vector<std::string>{
           "vo-cp:rank=256", "vo-cp:rank=256,iters=8,seed=3,exec=factored", "qk-cp:rank=0",
           "tucker-qkvo:rank=128x256", "tucker-qkvo:rank=128,layers=8,iters=4", "tucker-ffn:rank=384,layers=15",
           "tucker-heads:rank=64x32,heads=3"}) {
    const transform::TensorSpec t = transform::parse_tensor_spec(old);
    const std::string stage = transform::tensor_transform_spec(t);
    const auto p = parse_transforms(stage);
    ASSERT_TRUE(p.tensor) << old;
    EXPECT_EQ(p.tensor->canonical(), t.canonical()) << old << " -> " << stage;
    EXPECT_EQ(p.tensor->rank2, t.rank2) << old;
    EXPECT_EQ(p.tensor->iterations(), t.iterations()) << old;
  }
  EXPECT_EQ(transform::tensor_transform_spec(transform::parse_tensor_spec("vo-cp:rank=256,iters=8")),
            "tensor.vo_cp(rank=256,iters=8)");
}

TEST(TransformPipeline, BadInputIsRefusedClearly) {
  struct Case {
    std::string pipeline;
    std::vector<std::string> says;
  };
  for (const Case& c : std::vector<Case>{
           {"mla(rank=128)||bda(pairs=qk)", {"empty item", "'|'"}},
           {"|mla(rank=128)", {"empty item"}},
           {"mla(rank=128)|", {"empty item"}},
           {"mla(rank=128", {"never closed"}},
           {"mla(rank=128))", {"closes no '('"}},
           {"foo(rank=1)", {"unknown transform 'foo'", "mla", "tensor.vo_cp", "numattn transforms"}},
           {"mla(rank=128,ranks=3)", {"unknown parameter 'ranks'", "valid keys of mla", "rope_heads"}},
           {"mla(rank=-2)", {"rank=-2", "out of range"}},
           {"mla(rank=-1)", {"mla needs rank=", "budget="}},
           {"mla(budget=0)", {"mla needs rank=", "budget="}},
           {"mla(budget=-0.5)", {"budget=-0.5", "out of range"}},
           {"mla(budget=1.5)", {"budget=1.5", "out of range"}},
           {"mla(budget=0.5,rank=64)", {"budget", "chooses rank"}},
           {"mla(budget=0.5,freqfold=2)", {"budget", "chooses rank"}},
           {"mla(rank=64,rope_dims=31)", {"rope_dims", "even"}},
           {"mla(rank=64,rope_dims=32,rope_heads=2)", {"rope_dims", "not both"}},
           {"mla(rank=64,calib_mode=twice)", {"calib_mode=twice", "not one of the allowed values"}},
           {"mla(rank=12.5)", {"not an integer"}},
           {"mla(rope_heads=2)", {"mla needs rank="}},
           {"tensor.vo_cp(iters=3)", {"tensor.vo_cp needs rank="}},
           {"mla(rank=1,exec=fast)", {"exec=fast", "not one of the allowed values", "absorbed|naive"}},
           {"bda(pairs=kv)", {"pairs=kv"}},
           {"mla(rank=1,rank=2)", {"given twice"}},
           {"mla(rank)", {"must be key=value"}},
           {"bda(pairs=vo)|mla(rank=1)", {"mla must come first"}},
           {"mla(rank=1)|mla(rank=2)", {"mla is given twice"}},
           {"bda(pairs=vo)|tensor.vo_cp(rank=8)", {"cannot be combined with bda"}},
           {"tensor.vo_cp(rank=8)|bda(pairs=vo)", {"cannot be combined with a tensor"}},
           {"mla(rank=64)|tensor.vo_cp(rank=8)", {"after mla only tensor.qk_cp applies"}},
           {"tensor.vo_cp(rank=8)|tensor.qk_cp(rank=8)", {"give one"}},
           {"tensor.tucker_ffn(rank=0)", {"rank=0", "out of range"}},
           {"tensor.qk_cp(rank=8,exec=factored)", {"unknown parameter 'exec'"}}}) {
    const std::string e = error_of(c.pipeline);
    ASSERT_FALSE(e.empty()) << c.pipeline << " was accepted";
    for (const std::string& s : c.says) EXPECT_NE(e.find(s), std::string::npos) << c.pipeline << ": " << e;
  }
}

TEST(TransformPipeline, RegistryDescribesEveryTransform) {
  const auto& all = transform::list_transforms();
  ASSERT_EQ(all.size(), 7u);
  for (const MethodInfo* m : all) {
    EXPECT_EQ(transform::find_transform(m->name), m);
    EXPECT_FALSE(m->summary.empty()) << m->name;
    EXPECT_FALSE(m->citation.empty()) << m->name;
    for (const ParamSpec& p : m->params) EXPECT_FALSE(p.doc.empty()) << m->name << "." << p.name;
  }
  EXPECT_EQ(transform::find_transform("tensor.vo-cp"), nullptr);
}

}  // namespace NUMATTN_UNITY_ID
}  // namespace
}  // namespace numattn
